package cluster

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestRunSmall runs the section small: every create succeeds in both
// modes, one apply per create makes as many applies as creates (and a
// few more where a reload was lost), the shared applies fewer, and the
// tables are printed.
func TestRunSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Options{Nodes: []int{1, 3}, Creates: 4, Zones: []int{5}, ZoneNodes: 2, Burst: 4}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	var bursts []Burst
	for _, tp := range res.Throughput {
		want := tp.Nodes * 4
		if tp.Shared.OK != want || tp.OnEach.OK != want {
			t.Errorf("%d nodes: %d and %d of %d creates succeeded (%s %s)", tp.Nodes, tp.Shared.OK, tp.OnEach.OK, want, tp.Shared.FirstErr, tp.OnEach.FirstErr)
		}
		bursts = append(bursts, tp.Shared, tp.OnEach)
	}
	for _, r := range res.ZoneRows {
		if r.Shared.OK != 4 || r.OnEach.OK != 4 || r.Apply <= 0 {
			t.Errorf("%d zones: %+v", r.Zones, r)
		}
		bursts = append(bursts, r.Shared, r.OnEach)
	}
	for i := 0; i < len(bursts); i += 2 {
		shared, each := bursts[i], bursts[i+1]
		if each.Applies < each.OK {
			t.Errorf("one apply per create made %d applies for %d creates", each.Applies, each.OK)
		}
		if shared.Applies >= each.Applies {
			t.Errorf("shared applies: %d, one per create: %d; want fewer shared", shared.Applies, each.Applies)
		}
	}
	for _, s := range []string{"one apply per create", "zones", "cost model"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q", s)
		}
	}
}
