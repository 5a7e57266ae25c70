package sandboxapi

import (
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestQuotaTake: an owner holds at most its share (429), a call larger
// than the share is refused for good (400), the node's total binds every
// owner (503); "" is the owner "-"; releasing (once, however often
// called) restores both; every refusal is counted for its owner.
func TestQuotaTake(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQuota("exec-slots", "calls", 100, 30, false, met) // 3 seats, 10 over

	releases := map[string][]func(){}
	steps := []struct {
		owner  string
		n      int64
		status int // 0: taken
	}{
		{"a", 20, 0},
		{"a", 10, 0},                            // the whole share
		{"a", 1, http.StatusTooManyRequests},    // past it
		{"b", 31, http.StatusBadRequest},        // a call over the share: never
		{"b", 30, 0},                            // b's share
		{"b", 1, http.StatusTooManyRequests},    // nothing more beside it
		{"", 30, 0},                             // owner "-"
		{"-", 1, http.StatusTooManyRequests},    // the owner of "": its share is full
		{"d", 10, 0},                            // a fourth owner: the 10 past three seats
		{"c", 1, http.StatusServiceUnavailable}, // 100 of 100 in use
	}
	for i, s := range steps {
		rel, err := q.take(s.owner, s.n)
		var re *retryError
		var p *apitype.Problem
		switch {
		case s.status == 0 && err != nil:
			t.Fatalf("step %d %+v: %v", i, s, err)
		case s.status == http.StatusBadRequest:
			if !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || errors.As(err, &re) {
				t.Fatalf("step %d %+v: %v, want invalid-request without Retry-After", i, s, err)
			}
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
	for owner, want := range map[string]float64{"a": 1, "b": 2, "-": 1} {
		if got := testutil.ToFloat64(met.quotaRefusals.WithLabelValues(owner, "exec-slots")); got != want {
			t.Errorf("refusals of %s: %v, want %v", owner, got, want)
		}
	}
	if got := testutil.ToFloat64(met.quotaRefusals.WithLabelValues("c", "node-exec-slots")); got != 1 {
		t.Errorf("node refusals of c: %v", got)
	}
	if q.used != 70 || len(q.byOwner) != 3 {
		t.Errorf("used %d by %v, want 70 by b, - and d", q.used, q.byOwner)
	}
}

// TestQuotaBorrow: past its share an owner of a borrowing quota may take
// only from the part of the node total that is not whole shares (here
// 100 mod 30 = 10), shared by every owner; giving back frees it.
func TestQuotaBorrow(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	q := newQuota("collected-bytes", "bytes", 100, 30, true, met)
	rel := map[string]func(){}
	for i, s := range []struct {
		owner string
		n     int64
		ok    bool
	}{
		{"a", 30, true},
		{"a", 6, true},  // 6 of the 10 spare
		{"b", 34, true}, // a first call past the share: the other 4 spare
		{"b", 1, false}, // the spare is gone
		{"c", 30, true}, // c's share is there
		{"a", 1, false}, // nothing to borrow
		{"x", 41, false},
	} {
		r, err := q.take(s.owner, s.n)
		if (err == nil) != s.ok {
			t.Fatalf("step %d %+v: %v", i, s, err)
		}
		if r != nil && s.owner == "b" {
			rel["b"] = r
		}
	}
	rel["b"]()
	if _, err := q.take("a", 4); err != nil {
		t.Fatalf("a borrows the spare b gave back: %v", err)
	}
}
