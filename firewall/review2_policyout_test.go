package firewall

import (
	"testing"
)

// TestReview2MgmtUntrackedVsHostOutputPolicy (review2): pve-firewall's
// PVEFW-HOST-OUT (src/PVE/Firewall.pm, the host outbound chain) accepts
// "-m conntrack --ctstate RELATED,ESTABLISHED" (ruleset_chain_add_conn_filters),
// then the operator's OUT rules and "-d $localnet --dport 8006/22" (a
// destination port: the node as a client), then the cluster's policy_out;
// proxmox-firewall's output chain likewise (default-out's ct state vmap,
// then cluster-out ending in the cluster's default policy for Out). With
// policy_out DROP or REJECT (a documented cluster option), the node's
// replies from 8006 and 22 pass only as ESTABLISHED. The guard's
// mgmt-notrack-out makes them untracked: no longer ESTABLISHED, they meet
// the policy and are dropped, so installing the daemon locks the operator
// out of the node's API and SSH.
func TestReview2MgmtUntrackedVsHostOutputPolicy(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	mc := plugGuest(t, n, "mgmtc0", "eth0", "192.0.2.10", "")
	ml := n.Listen(t, "tcp4", "192.0.2.2:8006")
	go func() {
		for {
			c, err := ml.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("mgmt\n"))
			c.Close()
		}
	}()
	// the host firewall's output chain with policy_out DROP, as
	// pve-firewall and proxmox-firewall build it
	n.NFT(t, `table inet pvefwsim {
	chain out {
		type filter hook output priority 0; policy drop;
		oifname "lo" accept
		ct state invalid drop
		ct state related,established accept
		ip daddr 192.0.2.0/24 tcp dport { 8006, 22 } accept
	}
}`)
	if _, err := connectMgmt(mc.ns, "192.0.2.2:8006"); err != nil {
		t.Fatalf("without the guard, management port with policy_out DROP: %v", err)
	}
	startGuard(t, n, cfg)
	if _, err := connectMgmt(mc.ns, "192.0.2.2:8006"); err != nil {
		t.Errorf("with the guard, the node's API no longer answers under the host firewall's policy_out DROP: %v", err)
	}
}
