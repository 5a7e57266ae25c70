package containment

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// scaleRules: the node drops every datagram and connection to the busy
// node's other zones (10.99.0.0/16) before routing, and everything but the
// zone resolver on its gateway, so every such row is blocked the slow way
// (silence until the per-probe timeout).
const scaleRules = `table inet piscale {
	chain pre {
		type filter hook prerouting priority -10; policy accept;
		ip daddr 10.99.0.0/16 drop
	}
	chain input {
		type filter hook input priority 0; policy accept;
		ip daddr 10.78.0.1 meta l4proto tcp drop
		ip daddr 10.78.0.1 udp dport != 53 drop
	}
}
`

// TestRunnerManyBlockedRows runs the real probe in a namespace against a
// busy node's worth of blocked targets (other zones' gateways, their
// guests, LAN targets: several hundred rows, every one silent until its
// timeout) and requires it to finish within the runner's computed exec
// timeout with a result for every planned row.
func TestRunnerManyBlockedRows(t *testing.T) {
	guest := testkit.NewNetNS(t, "pisg")
	node := testkit.NewNetNS(t, "pisn")
	wireGuest(t, guest, node, "10.78.0.1/24", "10.78.0.2/24")
	guest.ResolvConf(t, "nameserver 10.78.0.1\n")
	testkit.ServeDNS(t, node.ListenPacket(t, "udp4", "10.78.0.1:53"), testkit.DNSZone{
		A: map[string][]netip.Addr{"guest.zone1.test": {netip.MustParseAddr("10.78.0.2")}}})
	node.NFT(t, scaleRules)

	spec := Spec{
		Gateway:      netip.MustParseAddr("10.78.0.1"),
		Subnet:       netip.MustParsePrefix("10.78.0.0/24"),
		HostAddrs:    []netip.Addr{},
		Metadata:     []netip.Addr{},
		MetadataDNS:  []netip.Addr{},
		ExternalName: "example.test",
		LocalName:    "guest.zone1.test",
		Timeout:      500 * time.Millisecond,
	}
	for i := range 40 {
		spec.OtherGateways = append(spec.OtherGateways, netip.AddrFrom4([4]byte{10, 99, byte(i), 1}))
	}
	for i := range 80 {
		spec.OtherZone = append(spec.OtherZone, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 99, byte(100 + i/2), byte(10 + i%2)}), 22))
	}
	for i := range 20 {
		spec.LAN = append(spec.LAN, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 99, 200, byte(1 + i/2)}), []uint16{22, 80}[i%2]))
	}
	plan, err := NewPlan(spec, LockdownPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if plan.Sampling != nil || len(plan.Checks) < 500 {
		t.Fatalf("%d rows, sampling %+v: want every row of a plan of several hundred", len(plan.Checks), plan.Sampling)
	}
	r := &Runner{ProbePath: probebuild.ForTest(t), GuestDir: t.TempDir(), Concurrency: 16}
	req := plan.request(r.concurrency(len(plan.Checks)), signalPlaceholder)
	limit := r.execTimeout(req)
	ctx, cancel := context.WithTimeout(context.Background(), limit+time.Minute)
	defer cancel()
	start := time.Now()
	res, err := r.Run(ctx, &nsGuest{ns: guest}, plan)
	took := time.Since(start)
	t.Logf("%d rows at concurrency %d: %v, exec timeout %v", len(plan.Checks), req.Concurrency, took, limit)
	if err != nil {
		t.Fatalf("run (exec timeout %v): %v", limit, err)
	}
	if took > limit {
		t.Errorf("took %v, over the exec timeout %v", took, limit)
	}
	if len(res.Rows) != len(plan.Checks)+1 {
		t.Fatalf("%d rows for %d checks and the lease", len(res.Rows), len(plan.Checks))
	}
	blocked := 0
	for _, row := range res.Rows {
		if row.Status != Pass {
			t.Errorf("%s (%s): %s, observed %s: %s", row.Name, row.Target, row.Status, row.Observed, row.Detail)
		}
		if row.Expect == Blocked && row.Observed == Blocked {
			blocked++
		}
	}
	if blocked < 500 {
		t.Errorf("%d rows blocked, want the several hundred planned", blocked)
	}
	if !res.ControlsOK || !res.Passed() {
		t.Errorf("controls ok %v, passed %v", res.ControlsOK, res.Passed())
	}
}
