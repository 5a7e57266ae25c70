package scale

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestRatiosAndGoals(t *testing.T) {
	lo := SizeResult{Bridges: 1, NewBridge: []time.Duration{time.Millisecond}, Lockdown: []time.Duration{time.Millisecond},
		Burst: time.Millisecond, BurstSize: 50, StartToReady: time.Millisecond}
	hi := lo
	hi.Bridges = 2000
	hi.NewBridge = []time.Duration{60 * time.Millisecond}
	var b bytes.Buffer
	(&Result{Sizes: []SizeResult{lo, hi}}).printRatios(&b)
	out := b.String()
	for _, want := range []string{"ratio 2000/1 bridges", "60.00x  goal < 50ms: MISSED", "1.00x  goal < 5ms: met", "1.00x  goal < 250ms: met"} {
		if !strings.Contains(out, want) {
			t.Errorf("ratios lack %q:\n%s", want, out)
		}
	}
}

// TestRunSmall runs every measurement once at a small size: each figure
// is there and the guard is in force after the burst (Run checks Verify
// and nft list set itself). Times are not asserted.
func TestRunSmall(t *testing.T) {
	testkit.RequireRoot(t, "ip", "nft")
	res, err := Run(context.Background(), Options{Sizes: []int{3}, Singles: 2, Burst: 3, Changes: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sizes) != 1 {
		t.Fatalf("%d sizes, want 1", len(res.Sizes))
	}
	r := res.Sizes[0]
	if r.Bridges != 3 || len(r.NewBridge) != 2 || r.BurstSize != 3 || len(r.PortMoved) != 2 || len(r.ZoneAdded) != 2 || len(r.Lockdown) != 2 {
		t.Errorf("result %+v: a measurement is missing", r)
	}
	if r.StartToReady <= 0 || r.Burst < 0 {
		t.Errorf("start to ready %v, burst %v", r.StartToReady, r.Burst)
	}
}
