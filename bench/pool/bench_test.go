package pool

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestRunQuick runs the section small on the bed: claims come from the
// pool and make no SDN apply, cold creates do, and the table says so.
func TestRunQuick(t *testing.T) {
	testkit.RequireRoot(t, "qemu-ga", "dnsmasq", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Options{Rounds: 3, Target: 2, Burst: 5}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if res.ClaimP50 <= 0 || res.ColdP50 <= res.ClaimP50 || res.Ratio <= 1 {
		t.Errorf("claim p50 %s, cold p50 %s, ratio %.1f: want a claim faster than a cold create", res.ClaimP50, res.ColdP50, res.Ratio)
	}
	if res.SDNAppliesPerClaim != 0 || res.SDNAppliesPerCold < 1 || res.CallsPerClaimTotal <= 0 || res.CallsPerCold <= res.CallsPerClaimTotal {
		t.Errorf("calls per claim %v (%.1f), per cold create %.1f (%.1f SDN applies): want no SDN apply and fewer calls on a claim", res.CallsPerClaim, res.CallsPerClaimTotal, res.CallsPerCold, res.SDNAppliesPerCold)
	}
	if res.BurstHits < 2 || res.BurstHits+res.BurstMisses != 5 {
		t.Errorf("burst: %d hits, %d misses, want at least the pool's 2 hits of 5", res.BurstHits, res.BurstMisses)
	}
	if !strings.Contains(out.String(), "claim from the pool") || !strings.Contains(out.String(), "back to back") {
		t.Errorf("table %q", out.String())
	}
	t.Log("\n" + out.String())
}
