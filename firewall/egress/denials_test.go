package egress

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestDenials(t *testing.T) {
	d := NewDenials()
	for i := range keepDenials + 5 {
		d.Record("sb1", Denial{Reason: ReasonName, Name: strings.Repeat("a", i%3+1) + ".evil.test"})
	}
	d.Record("sb2", Denial{Reason: ReasonSNI, Name: "x.test", Dest: "203.0.113.10:443"})
	if n := len(d.Recent("sb1")); n != keepDenials {
		t.Errorf("%d recent denials kept, want %d", n, keepDenials)
	}
	if got := testutil.ToFloat64(d.total.WithLabelValues("sb1", ReasonName)); got != keepDenials+5 {
		t.Errorf("counter %v, want %d (every denial counts)", got, keepDenials+5)
	}
	if r := d.Recent("sb2"); len(r) != 1 || r[0].Dest != "203.0.113.10:443" || r[0].Time.IsZero() {
		t.Errorf("sb2 denials %+v", r)
	}
	problems, err := testutil.CollectAndLint(d.Collector())
	if err != nil || len(problems) != 0 {
		t.Errorf("metric lint: %v %v", problems, err)
	}
	d.Forget("sb1")
	if len(d.Recent("sb1")) != 0 {
		t.Error("Forget kept the recent denials")
	}
}
