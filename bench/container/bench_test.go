package container

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestVerdicts: the goals' verdicts from given figures (not measured).
func TestVerdicts(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name        string
		cold        []time.Duration
		mem         []uint64
		cold0, mem0 string
	}{
		{"both met", []time.Duration{400 * ms, 500 * ms, 600 * ms}, []uint64{18 << 20, 20 << 20}, "container cold create-to-ready under 1s: met (p50 500.0ms, p99 600.0ms)", "idle container under 32 MiB: met (max 20.0 MiB of 2)"},
		{"p99 over", []time.Duration{400 * ms, 500 * ms, 1500 * ms}, []uint64{40 << 20}, "container cold create-to-ready under 1s: met at p50 (500.0ms), MISSED at p99 (1.50s)", "idle container under 32 MiB: MISSED (max 40.0 MiB of 1)"},
		{"p50 over", []time.Duration{1200 * ms, 1300 * ms, 1500 * ms}, []uint64{32 << 20}, "container cold create-to-ready under 1s: MISSED (p50 1.30s, p99 1.50s)", "idle container under 32 MiB: MISSED (max 32.0 MiB of 1)"},
		{"no samples", nil, nil, "container cold create-to-ready under 1s: MISSED: no samples", "idle container under 32 MiB: MISSED: no samples"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{Container: Kind{Cold: tc.cold, IdleMemory: tc.mem}}
			v := r.Verdicts()
			if len(v) != 2 || v[0] != tc.cold0 || v[1] != tc.mem0 {
				t.Errorf("verdicts %q, want %q and %q", v, tc.cold0, tc.mem0)
			}
			var b bytes.Buffer
			r.Print(&b)
			if !strings.Contains(b.String(), "  "+tc.cold0+"\n") || !strings.Contains(b.String(), "pool claim create-to-ready p50") {
				t.Errorf("table lacks the verdict %q:\n%s", tc.cold0, b.String())
			}
		})
	}
}

// TestRunQuick runs the section small on the bed: every figure has its
// samples, both kinds' idle members have memory on the node (a
// container's within its cap), and both kinds' claims came from their
// pool (create checks from_pool) with a row of their own. No time is
// asserted.
func TestRunQuick(t *testing.T) {
	testkit.RequireRoot(t, "qemu-ga", "dnsmasq", "lxc-start", "lxc-attach", "debootstrap", "nsenter")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Options{Rounds: 2, Execs: 3, Claims: 2, Idle: 2, Settle: time.Second}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for name, n := range map[string][2]int{
		"cold": {len(res.Container.Cold), len(res.VM.Cold)}, "exec api": {len(res.Container.ExecAPI), len(res.VM.ExecAPI)},
		"exec guest": {len(res.Container.ExecGuest), len(res.VM.ExecGuest)}, "idle": {len(res.Container.IdleMemory), len(res.VM.IdleMemory)},
		"claims": {len(res.Container.Claims), len(res.VM.Claims)},
	} {
		want := map[string]int{"cold": 2, "exec api": 3, "exec guest": 3, "idle": 2, "claims": 2}[name]
		if n[0] != want || n[1] != want {
			t.Errorf("%s: %d container and %d VM samples, want %d each", name, n[0], n[1], want)
		}
	}
	for i, m := range res.Container.IdleMemory {
		if m == 0 || m > memoryMiB<<20 {
			t.Errorf("idle container %d: %d bytes, want some and at most its %d MiB", i, m, memoryMiB)
		}
	}
	for i, m := range res.VM.IdleMemory {
		if m == 0 {
			t.Errorf("idle VM %d: no memory read", i)
		}
	}
	if !strings.Contains(out.String(), "pool claim create-to-ready p50 (2 each) ") || strings.Contains(out.String(), "pending") {
		t.Errorf("table lacks the claims of both kinds:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "idle container under 32 MiB: ") || !strings.Contains(out.String(), "container cold create-to-ready under 1s: ") {
		t.Errorf("table lacks the goals:\n%s", out.String())
	}
}
