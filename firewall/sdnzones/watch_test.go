package sdnzones

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type applyRecorder struct {
	mu    sync.Mutex
	calls []map[string][]string
	fail  error
}

func (r *applyRecorder) apply(_ context.Context, z map[string][]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.calls = append(r.calls, z)
	return nil
}

func (r *applyRecorder) last() (map[string][]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) == 0 {
		return nil, 0
	}
	return r.calls[len(r.calls)-1], len(r.calls)
}

const (
	twoZones   = `{"version":1,"zones":{"ids":{"abc123z":{"type":"simple"},"xyz456z":{"type":"simple"}}},"vnets":{"ids":{"abc123v0":{"type":"vnet","zone":"abc123z"},"abc123v1":{"type":"vnet","zone":"abc123z"},"xyz456v0":{"type":"vnet","zone":"xyz456z"}}}}`
	threeVNets = `{"version":2,"zones":{"ids":{"abc123z":{"type":"simple"},"xyz456z":{"type":"simple"}}},"vnets":{"ids":{"abc123v0":{"type":"vnet","zone":"abc123z"},"abc123v1":{"type":"vnet","zone":"abc123z"},"abc123v2":{"type":"vnet","zone":"abc123z"},"xyz456v0":{"type":"vnet","zone":"xyz456z"}}}}`
)

func write(t *testing.T, path, doc string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestWatcherSync walks one watcher through the states a node goes
// through: SDN never applied, applied, a vnet added, a garbled write, the
// file vanishing (pmxcfs not mounted), a fixed file.
func TestWatcherSync(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), ".running-config")
	rec := &applyRecorder{}
	reg := prometheus.NewPedanticRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Path: path, Apply: rec.apply, Exclude: []string{"xyz456v0"}, Metrics: met})
	if err != nil {
		t.Fatal(err)
	}
	abc := []string{"abc123v0", "abc123v1"}
	steps := []struct {
		name      string
		doc       *string // nil: remove the file
		wantErr   bool
		wantZones map[string][]string
		wantCalls int
		valid     float64
	}{
		{name: "absent: never applied, nothing to hand over", wantZones: nil, wantCalls: 0, valid: 1},
		{name: "applied", doc: ptr(twoZones), wantZones: map[string][]string{"abc123z": abc}, wantCalls: 1, valid: 1},
		{name: "same file again", doc: ptr(twoZones), wantZones: map[string][]string{"abc123z": abc}, wantCalls: 1, valid: 1},
		{name: "vnet added", doc: ptr(threeVNets), wantZones: map[string][]string{"abc123z": {"abc123v0", "abc123v1", "abc123v2"}}, wantCalls: 2, valid: 1},
		{name: "garbled keeps the last good", doc: ptr(`{"version":3,"zones":{"ids":{"abc123z"`), wantErr: true,
			wantZones: map[string][]string{"abc123z": {"abc123v0", "abc123v1", "abc123v2"}}, wantCalls: 2, valid: 0},
		{name: "vanished keeps the last good", wantErr: true,
			wantZones: map[string][]string{"abc123z": {"abc123v0", "abc123v1", "abc123v2"}}, wantCalls: 2, valid: 0},
		{name: "fixed", doc: ptr(twoZones), wantZones: map[string][]string{"abc123z": abc}, wantCalls: 3, valid: 1},
		{name: "everything deleted", doc: ptr(`{"version":9,"zones":{"ids":{}},"vnets":{"ids":{}}}`), wantZones: map[string][]string{}, wantCalls: 4, valid: 1},
	}
	for _, s := range steps {
		if s.doc == nil {
			_ = os.Remove(path)
		} else {
			write(t, path, *s.doc)
		}
		err := w.Sync(ctx)
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: err %v, want error %v", s.name, err, s.wantErr)
		}
		got, n := rec.last()
		if n != s.wantCalls || !reflect.DeepEqual(got, s.wantZones) || !reflect.DeepEqual(w.Zones(), s.wantZones) {
			t.Fatalf("%s: applied %v (%d calls), Zones() %v; want %v (%d calls)", s.name, got, n, w.Zones(), s.wantZones, s.wantCalls)
		}
		if v := testutil.ToFloat64(met.valid); v != s.valid {
			t.Errorf("%s: config_valid %v, want %v", s.name, v, s.valid)
		}
	}
	if v := testutil.ToFloat64(met.errors.WithLabelValues("parse")); v != 1 {
		t.Errorf("parse errors %v, want 1", v)
	}
	if v := testutil.ToFloat64(met.errors.WithLabelValues("missing")); v != 1 {
		t.Errorf("missing errors %v, want 1", v)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestWatcherApplyFailureRetries: zones the guard refused are offered
// again at the next read although the file did not change.
func TestWatcherApplyFailureRetries(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), ".running-config")
	write(t, path, twoZones)
	rec := &applyRecorder{fail: errors.New("netlink: busy")}
	w, err := New(Options{Path: path, Apply: rec.apply})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(ctx); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("want the apply error, got %v", err)
	}
	if w.Zones() != nil {
		t.Fatalf("zones recorded although not applied: %v", w.Zones())
	}
	rec.fail = nil
	if err := w.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, n := rec.last(); n != 1 {
		t.Fatalf("unchanged file not offered again after a failed apply (%d calls)", n)
	}
}

// TestWatcherRunKick: Run picks up a change when kicked, long before its
// poll interval.
func TestWatcherRunKick(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".running-config")
	write(t, path, twoZones)
	rec := &applyRecorder{}
	w, err := New(Options{Path: path, Apply: rec.apply, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := w.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	write(t, path, threeVNets)
	w.Kick()
	deadline := time.Now().Add(time.Minute)
	for {
		if z, _ := rec.last(); len(z["abc123z"]) == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kick did not re-read the file: %v", w.Zones())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(Options{Apply: (&applyRecorder{}).apply}); err == nil {
		t.Error("no path accepted")
	}
	if _, err := New(Options{Path: "/x"}); err == nil {
		t.Error("no apply accepted")
	}
}

func ptr(s string) *string { return &s }
