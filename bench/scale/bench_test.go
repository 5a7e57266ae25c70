package scale

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestQuantile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	cases := []struct {
		name string
		ds   []time.Duration
		q    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of odd", ms(5, 1, 3), 0.5, 3 * time.Millisecond},
		{"median of even is the lower", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p99 of 20 is the largest", ms(20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19), 0.99, 20 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := quantile(tc.ds, tc.q); got != tc.want {
				t.Errorf("quantile(%v, %v) = %v, want %v", tc.ds, tc.q, got, tc.want)
			}
		})
	}
}

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
