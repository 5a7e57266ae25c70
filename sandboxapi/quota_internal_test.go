package sandboxapi

import (
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestQuotaTake: an owner holds at most its share (429), may always take
// a first call's worth within the node's total, the node's total binds
// every owner (503); "" is the owner "-"; releasing (once, however often
// called) restores both; every refusal is counted for its owner.
func TestQuotaTake(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQuota("exec-slots", "calls", 100, 30, false, met)
	releases := map[string][]func(){}
	steps := []struct {
		owner  string
		n      int64
		status int // 0: taken
	}{
		{"a", 20, 0},
		{"a", 10, 0},                            // the whole share
		{"a", 1, http.StatusTooManyRequests},    // past it
		{"b", 50, 0},                            // a first call over the share
		{"b", 1, http.StatusTooManyRequests},    // nothing more beside it
		{"", 20, 0},                             // owner "-"
		{"-", 1, http.StatusServiceUnavailable}, // the owner of "": within its share, but the node is full
		{"c", 1, http.StatusServiceUnavailable}, // 100 of 100 in use
	}
	for i, s := range steps {
		rel, err := q.take(s.owner, s.n)
		var re *retryError
		switch {
		case s.status == 0 && err != nil:
			t.Fatalf("step %d %+v: %v", i, s, err)
		case s.status != 0 && (!errors.As(err, &re) || re.p.Status != s.status || re.after <= 0):
			t.Fatalf("step %d %+v: %v, want %d with a Retry-After", i, s, err, s.status)
		case s.status == http.StatusTooManyRequests && re.p.Type != apitype.ProblemTooManyRequests:
			t.Fatalf("step %d: type %s", i, re.p.Type)
		}
		if rel != nil {
			releases[s.owner] = append(releases[s.owner], rel)
		}
	}
	for _, r := range releases["a"] {
		r()
		r() // a second call gives nothing back twice
	}
	if rel, err := q.take("c", 30); err != nil {
		t.Fatalf("after a's calls ended: %v", err)
	} else {
		rel()
	}
	for owner, want := range map[string]float64{"a": 1, "b": 1} {
		if got := testutil.ToFloat64(met.quotaRefusals.WithLabelValues(owner, "exec-slots")); got != want {
			t.Errorf("refusals of %s: %v, want %v", owner, got, want)
		}
	}
	if got := testutil.ToFloat64(met.quotaRefusals.WithLabelValues("-", "node-exec-slots")); got != 1 {
		t.Errorf("node refusals of -: %v", got)
	}
	if got := testutil.ToFloat64(met.quotaRefusals.WithLabelValues("c", "node-exec-slots")); got != 1 {
		t.Errorf("node refusals of c: %v", got)
	}
	if q.used != 70 || len(q.byOwner) != 2 {
		t.Errorf("used %d by %v, want 70 by b and -", q.used, q.byOwner)
	}
}

// TestQuotaBorrow: past its share an owner of a borrowing quota may take
// more while a full share of the node stays free after the take; the
// next owner still finds its share.
func TestQuotaBorrow(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQuota("collected-bytes", "bytes", 100, 30, true, met)
	for i, s := range []struct {
		owner string
		n     int64
		ok    bool
	}{
		{"a", 30, true},
		{"a", 40, true}, // 70: 30 left free, a whole share
		{"a", 1, false}, // would leave 29
		{"b", 30, true}, // b's share is there
		{"b", 1, false}, // the node is full
	} {
		_, err := q.take(s.owner, s.n)
		if (err == nil) != s.ok {
			t.Fatalf("step %d %+v: %v", i, s, err)
		}
	}
}
