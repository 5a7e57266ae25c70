package halt

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeSystemd models the few systemd semantics the halt relies on: a mask
// takes effect on reload, a masked unit cannot start, jobs report results.
type fakeSystemd struct {
	calls     []string
	masked    map[string]bool // unit files masked (runtime)
	loaded    map[string]bool // masks in effect (after reload)
	active    map[string]bool
	maskNoop  bool   // the mask does not take effect (overridden unit file)
	stopRes   string // job result for stops; "done" when empty
	maskErr   error
	closed    int
	propsErr  error
	startFail bool
}

func newFake(units ...string) *fakeSystemd {
	f := &fakeSystemd{masked: map[string]bool{}, loaded: map[string]bool{}, active: map[string]bool{}}
	for _, u := range units {
		f.active[u] = true
	}
	return f
}

func (f *fakeSystemd) MaskUnitFilesContext(_ context.Context, files []string, runtime, force bool) ([]sddbus.MaskUnitFileChange, error) {
	f.calls = append(f.calls, "mask:"+strings.Join(files, ","))
	if !runtime || !force {
		return nil, errors.New("fake: want a forced runtime mask")
	}
	if f.maskErr != nil {
		return nil, f.maskErr
	}
	for _, u := range files {
		f.masked[u] = true
	}
	return nil, nil
}

func (f *fakeSystemd) UnmaskUnitFilesContext(_ context.Context, files []string, runtime bool) ([]sddbus.UnmaskUnitFileChange, error) {
	f.calls = append(f.calls, "unmask:"+strings.Join(files, ","))
	if !runtime {
		return nil, errors.New("fake: want a runtime unmask")
	}
	for _, u := range files {
		delete(f.masked, u)
	}
	return nil, nil
}

func (f *fakeSystemd) ReloadContext(context.Context) error {
	f.calls = append(f.calls, "reload")
	f.loaded = map[string]bool{}
	for u := range f.masked {
		if !f.maskNoop {
			f.loaded[u] = true
		}
	}
	return nil
}

func (f *fakeSystemd) StopUnitContext(_ context.Context, name, _ string, ch chan<- string) (int, error) {
	f.calls = append(f.calls, "stop:"+name)
	res := f.stopRes
	if res == "" {
		res = "done"
		f.active[name] = false
	}
	ch <- res
	return 1, nil
}

func (f *fakeSystemd) StartUnitContext(_ context.Context, name, _ string, ch chan<- string) (int, error) {
	f.calls = append(f.calls, "start:"+name)
	if f.loaded[name] {
		return 0, errors.New("Unit " + name + " is masked.")
	}
	if f.startFail {
		ch <- "failed"
		return 1, nil
	}
	f.active[name] = true
	ch <- "done"
	return 1, nil
}

func (f *fakeSystemd) GetUnitPropertiesContext(_ context.Context, unit string) (map[string]any, error) {
	if f.propsErr != nil {
		return nil, f.propsErr
	}
	load, active := "loaded", "inactive"
	if f.loaded[unit] {
		load = "masked"
	}
	if f.active[unit] {
		active = "active"
	}
	return map[string]any{"LoadState": load, "ActiveState": active}, nil
}

func (f *fakeSystemd) ResetFailedUnitContext(_ context.Context, name string) error {
	f.calls = append(f.calls, "reset-failed:"+name)
	return nil
}

func (f *fakeSystemd) Close() { f.closed++ }

type fixture struct {
	h     *Halter
	fake  *fakeSystemd
	reg   *prometheus.Registry
	state string
	dials int
}

func newFixture(t *testing.T, dialErr error) *fixture {
	t.Helper()
	fx := &fixture{fake: newFake(DefaultUnits()...), reg: prometheus.NewRegistry(),
		state: filepath.Join(t.TempDir(), "run", "pve-inspectd", "halted")}
	dial := func(context.Context) (systemd, error) {
		fx.dials++
		if dialErr != nil {
			return nil, dialErr
		}
		return fx.fake, nil
	}
	h, err := newHalter(Config{StateFile: fx.state}.withDefaults(), dial, nil, fx.reg)
	if err != nil {
		t.Fatal(err)
	}
	h.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	fx.h = h
	return fx
}

func (fx *fixture) readState(t *testing.T) State {
	t.Helper()
	b, err := os.ReadFile(fx.state)
	if err != nil {
		t.Fatalf("state file: %v", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("state file %q: %v", b, err)
	}
	return st
}

func (fx *fixture) metrics(t *testing.T, want string) {
	t.Helper()
	if err := testutil.GatherAndCompare(fx.reg, strings.NewReader(want), "pve_inspect_halted", "pve_inspect_halts_total", "pve_inspect_halt_failures_total"); err != nil {
		t.Error(err)
	}
}

const metricsHead = `
# HELP pve_inspect_halt_failures_total Halt attempts that could not prove every unit stopped and masked.
# TYPE pve_inspect_halt_failures_total counter
# HELP pve_inspect_halted 1 while a fail-deadly halt is in force (label: its reason); one series with reason="" and value 0 otherwise.
# TYPE pve_inspect_halted gauge
# HELP pve_inspect_halts_total Fail-deadly halts begun (transitions into the halted state).
# TYPE pve_inspect_halts_total counter
`

func TestHaltStopsAndMasks(t *testing.T) {
	fx := newFixture(t, nil)
	fx.metrics(t, metricsHead+`pve_inspect_halted{reason=""} 0
pve_inspect_halt_failures_total 0
pve_inspect_halts_total 0
`)
	if err := fx.h.Halt(context.Background(), "no default route"); err != nil {
		t.Fatal(err)
	}
	want := []string{"mask:pveproxy.service,pvedaemon.service", "reload", "stop:pveproxy.service", "stop:pvedaemon.service"}
	if !slices.Equal(fx.fake.calls, want) {
		t.Errorf("calls = %q, want %q (mask before stop)", fx.fake.calls, want)
	}
	for _, u := range DefaultUnits() {
		if fx.fake.active[u] || !fx.fake.loaded[u] {
			t.Errorf("%s: active=%v masked=%v", u, fx.fake.active[u], fx.fake.loaded[u])
		}
	}
	st := fx.readState(t)
	if st.Reason != "no default route" || !st.Since.Equal(fx.h.now()) || !slices.Equal(st.Units, DefaultUnits()) {
		t.Errorf("state = %+v", st)
	}
	fx.metrics(t, metricsHead+`pve_inspect_halted{reason="no default route"} 1
pve_inspect_halt_failures_total 0
pve_inspect_halts_total 1
`)
	if fx.fake.closed != fx.dials {
		t.Errorf("%d connections opened, %d closed", fx.dials, fx.fake.closed)
	}
}

func TestHaltIdempotent(t *testing.T) {
	fx := newFixture(t, nil)
	ctx := context.Background()
	if err := fx.h.Halt(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	since := fx.readState(t).Since
	fx.h.now = func() time.Time { return since.Add(time.Hour) }
	// Something started a unit behind our back: the second halt repairs it.
	fx.fake.active["pveproxy.service"] = true
	if err := fx.h.Halt(ctx, "second"); err != nil {
		t.Fatal(err)
	}
	if st := fx.readState(t); st.Reason != "first" || !st.Since.Equal(since) {
		t.Errorf("state after second halt = %+v, want the first reason and time", st)
	}
	if fx.fake.active["pveproxy.service"] {
		t.Error("second halt did not stop pveproxy again")
	}
	fx.metrics(t, metricsHead+`pve_inspect_halted{reason="first"} 1
pve_inspect_halt_failures_total 0
pve_inspect_halts_total 1
`)
}

func TestHaltFailures(t *testing.T) {
	tests := []struct {
		name    string
		dialErr error
		setup   func(*fakeSystemd)
		wantErr string
	}{
		{"systemd unreachable", errors.New("connect: no such file"), nil, "connect: no such file"},
		{"mask refused", nil, func(f *fakeSystemd) { f.maskErr = errors.New("Access denied") }, "Access denied"},
		{"mask without effect", nil, func(f *fakeSystemd) { f.maskNoop = true }, "not masked after runtime mask"},
		{"stop job failed", nil, func(f *fakeSystemd) { f.stopRes = "failed" }, `job result "failed"`},
		{"state unreadable", nil, func(f *fakeSystemd) { f.propsErr = errors.New("boom") }, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t, tt.dialErr)
			if tt.setup != nil {
				tt.setup(fx.fake)
			}
			err := fx.h.Halt(context.Background(), "why")
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Halt = %v, want error containing %q", err, tt.wantErr)
			}
			// The halt is on record even though it is incomplete.
			if st := fx.readState(t); st.Reason != "why" {
				t.Errorf("state = %+v", st)
			}
			fx.metrics(t, metricsHead+`pve_inspect_halted{reason="why"} 1
pve_inspect_halt_failures_total 1
pve_inspect_halts_total 1
`)
		})
	}
}

func TestHaltRewritesCorruptState(t *testing.T) {
	state := filepath.Join(t.TempDir(), "halted")
	if err := os.WriteFile(state, []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	fake := newFake(DefaultUnits()...)
	reg := prometheus.NewRegistry()
	// A damaged state file must not prevent building the Halter (the CLI
	// halt would fail otherwise).
	h, err := newHalter(Config{StateFile: state}.withDefaults(), func(context.Context) (systemd, error) { return fake, nil }, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(h.metrics.halted.WithLabelValues(unreadableReason)); v != 1 {
		t.Errorf("halted{reason=%q} = %v, want 1", unreadableReason, v)
	}
	if err := h.Halt(context.Background(), "again"); err != nil {
		t.Fatal(err)
	}
	fx := &fixture{state: state}
	if st := fx.readState(t); st.Reason != "again" {
		t.Errorf("state = %+v", st)
	}
}

func TestRecover(t *testing.T) {
	ctx := context.Background()
	gone := func(context.Context, State) error { return nil }
	persists := func(context.Context, State) error { return errors.New("no default route") }

	t.Run("not halted", func(t *testing.T) {
		fx := newFixture(t, nil)
		if err := fx.h.Recover(ctx, gone); !errors.Is(err, ErrNotHalted) {
			t.Fatalf("Recover = %v, want ErrNotHalted", err)
		}
		if len(fx.fake.calls) != 0 {
			t.Errorf("calls %q", fx.fake.calls)
		}
	})
	t.Run("no check", func(t *testing.T) {
		fx := newFixture(t, nil)
		if err := fx.h.Recover(ctx, nil); err == nil {
			t.Fatal("Recover without a cause check succeeded")
		}
	})
	t.Run("cause persists", func(t *testing.T) {
		fx := newFixture(t, nil)
		if err := fx.h.Halt(ctx, "why"); err != nil {
			t.Fatal(err)
		}
		fx.fake.calls = nil
		var seen State
		err := fx.h.Recover(ctx, func(ctx context.Context, st State) error { seen = st; return persists(ctx, st) })
		var ce *CauseError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "no default route") {
			t.Fatalf("Recover = %v, want *CauseError", err)
		}
		if seen.Reason != "why" {
			t.Errorf("cause check saw %+v", seen)
		}
		if len(fx.fake.calls) != 0 {
			t.Errorf("refused recover changed things: %q", fx.fake.calls)
		}
		if st := fx.readState(t); st.Reason != "why" {
			t.Errorf("state = %+v", st)
		}
	})
	t.Run("cause gone", func(t *testing.T) {
		fx := newFixture(t, nil)
		if err := fx.h.Halt(ctx, "why"); err != nil {
			t.Fatal(err)
		}
		fx.fake.calls = nil
		if err := fx.h.Recover(ctx, gone); err != nil {
			t.Fatal(err)
		}
		want := []string{"unmask:pveproxy.service,pvedaemon.service", "reload",
			"reset-failed:pveproxy.service", "start:pveproxy.service", "reset-failed:pvedaemon.service", "start:pvedaemon.service"}
		if !slices.Equal(fx.fake.calls, want) {
			t.Errorf("calls = %q, want %q", fx.fake.calls, want)
		}
		if _, err := os.Stat(fx.state); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("state file after recover: %v", err)
		}
		fx.metrics(t, metricsHead+`pve_inspect_halted{reason=""} 0
pve_inspect_halt_failures_total 0
pve_inspect_halts_total 1
`)
	})
	t.Run("start fails", func(t *testing.T) {
		fx := newFixture(t, nil)
		if err := fx.h.Halt(ctx, "why"); err != nil {
			t.Fatal(err)
		}
		fx.fake.startFail = true
		if err := fx.h.Recover(ctx, gone); err == nil {
			t.Fatal("Recover succeeded though the units did not start")
		}
		if _, err := os.Stat(fx.state); err != nil {
			t.Errorf("state file removed by a failed recover: %v", err)
		}
	})
}

func TestNewReflectsRecordedHalt(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "halted")
	if err := os.WriteFile(state, []byte(`{"reason":"earlier","since":"2026-01-01T00:00:00Z","units":["a.service"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h, err := New(Config{StateFile: state}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := h.Status(); err != nil || st.Reason != "earlier" || !slices.Equal(st.Units, []string{"a.service"}) {
		t.Errorf("Status = %+v, %v", st, err)
	}
	if v := testutil.ToFloat64(h.metrics.halted.WithLabelValues("earlier")); v != 1 {
		t.Errorf("halted{reason=earlier} = %v", v)
	}
}

func TestCleanReason(t *testing.T) {
	tests := []struct{ in, want string }{
		{"no default route", "no default route"},
		{"  padded\t", "padded"},
		{"line\nbreak\x00nul", "line break nul"},
		{"", "unspecified"},
		{"\n\t", "unspecified"},
		{"bad \xff utf8", "bad ? utf8"},
		{strings.Repeat("é", 150), strings.Repeat("é", 100)},
	}
	for _, tt := range tests {
		if got := cleanReason(tt.in); got != tt.want {
			t.Errorf("cleanReason(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"zero is defaults", Config{}, ""},
		{"custom", Config{Units: []string{"a.service", "b@x.service"}, StateFile: "/run/x/halted", Transport: TransportPrivate}, ""},
		{"empty units", Config{Units: []string{}}, "units"},
		{"bad unit", Config{Units: []string{"../x.service"}}, "units"},
		{"no suffix", Config{Units: []string{"pveproxy"}}, "units"},
		{"relative state", Config{StateFile: "run/halted"}, "state_file"},
		{"unclean state", Config{StateFile: "/run/../halted"}, "state_file"},
		{"transport", Config{Transport: "carrier-pigeon"}, "transport"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error starting %q", err, tt.wantErr)
			}
			if _, err := New(tt.cfg, nil, nil); err == nil {
				t.Error("New accepted a bad config")
			}
		})
	}
}

// FuzzCleanReason checks the invariants the state file, the journal and the
// metric label rely on, for any reason a caller passes.
func FuzzCleanReason(f *testing.F) {
	for _, s := range []string{"", "no default route", "a\nb", "\xff\xfe", strings.Repeat("é", 150), "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got := cleanReason(in)
		if got == "" || len(got) > maxReason || !utf8.ValidString(got) {
			t.Fatalf("cleanReason(%q) = %q", in, got)
		}
		if strings.IndexFunc(got, unicode.IsControl) >= 0 || strings.TrimSpace(got) != got {
			t.Fatalf("cleanReason(%q) = %q keeps control characters or padding", in, got)
		}
		if cleanReason(got) != got {
			t.Fatalf("cleanReason not idempotent on %q", got)
		}
	})
}
