package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// p50 returns the median of ds.
func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkEmuLifecycle creates and deletes a 2-VM sandbox on the emulator
// (fake backend) 20 times per op round and reports the median
// create-to-ready and delete times and the Proxmox API requests of one
// lifecycle (task polls included).
func BenchmarkEmuLifecycle(b *testing.B) {
	e := newEmuEnvTB(b)
	ctx := context.Background()
	req := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian"}}}
	var creates, deletes []time.Duration
	calls := 0
	n := 0
	for b.Loop() {
		for range 20 {
			before := len(e.emu.Requests())
			t0 := time.Now()
			sb, err := e.c.Create(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := e.c.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			creates = append(creates, t1.Sub(t0))
			deletes = append(deletes, time.Since(t1))
			calls += len(e.emu.Requests()) - before
			n++
		}
	}
	b.ReportMetric(float64(p50(creates).Microseconds())/1000, "create-p50-ms")
	b.ReportMetric(float64(p50(deletes).Microseconds())/1000, "delete-p50-ms")
	b.ReportMetric(float64(calls)/float64(n), "pve-calls/lifecycle")
}
