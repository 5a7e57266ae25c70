package firewall

import (
	"context"
	"testing"
)

// TestStatusWithOpenSandbox: `pve-inspectd status` and doctor's guard
// check (Inspect with the sandboxes' persisted policies, WithEgress, as
// daemon.InspectConfig passes them) show no difference for a node running
// one open sandbox, whose bridge is in egress_dns_zone. Found by review:
// Inspect rendered the configuration alone, so every node running an
// open sandbox reported a difference (status exited 1, doctor failed).
// Without the policies it still reports the set's member as a difference.
func TestStatusWithOpenSandbox(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g, err := New(cfg, WithNetNS(n.Handle()), WithEgress(map[string]ZoneEgress{"zb": {Mode: EgressOpen, Bridges: []string{"vnetB"}}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := Inspect(context.Background(), cfg, WithNetNS(n.Handle()), WithEgress(map[string]ZoneEgress{"zb": {Mode: EgressOpen, Bridges: []string{"vnetB"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Drifts) != 0 {
		t.Errorf("status of a node with one open sandbox: %v", st.Drifts)
	}
	st, err = Inspect(context.Background(), cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Drifts) != 1 || st.Drifts[0].Object != SetEgressDNSZone {
		t.Errorf("status without the sandboxes' policies: %v, want the egress_dns_zone member as the one difference", st.Drifts)
	}
}
