package egress

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFlowBlockSizes(t *testing.T) {
	cases := []struct {
		n    int
		want []int
	}{
		{n: 1, want: []int{1}},
		{n: 3, want: []int{2, 1}},
		{n: 100, want: []int{50, 50}},
		{n: 399, want: []int{200, 199}},
		{n: 400, want: []int{100, 100, 100, 100}},
		{n: 1002, want: []int{251, 251, 250, 250}},
	}
	for _, tc := range cases {
		got := flowBlockSizes(tc.n)
		if !slices.Equal(got, tc.want) {
			t.Errorf("flowBlockSizes(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// TestPrintFlows: the kernel flows' lines are printed once measured, with
// the off/on figures and the records kept, and not before.
func TestPrintFlows(t *testing.T) {
	measured := Result{Flows: 1000, FlowOff: 200 * time.Microsecond, FlowOn: 250 * time.Microsecond,
		FlowOff99: time.Millisecond, FlowOn99: 2 * time.Millisecond, FlowCPUOff: 400 * time.Millisecond,
		FlowCPUOn: 500 * time.Millisecond, FlowFollower: 80 * time.Millisecond, FlowRecords: 999, FlowDrain: 50 * time.Millisecond}
	cases := []struct {
		name string
		r    Result
		want []string
	}{
		{name: "not measured", r: Result{}},
		{name: "measured", r: measured, want: []string{
			"egress record off/on: kernel flows (conntrack follower), open zone, new HTTP connection (connect + request + response), median of 1000: 200µs / 250µs (1.25x, added 50µs); p99: 1ms / 2ms (2.00x)",
			"400ms / 500ms (1.25x, the follower adds 100ms per 1000 flows, its own thread (locked to it for this count) 80ms; 999/1000 flows recorded)",
			"at most 50ms after the block's last connection",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			tc.r.Print(&b)
			out := b.String()
			if tc.want == nil && strings.Contains(out, "kernel flows") {
				t.Errorf("kernel flows printed before measured:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("no %q in\n%s", w, out)
				}
			}
		})
	}
}
