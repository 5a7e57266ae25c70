package firewall

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall/mgmtport"
)

// hostOutChain models the host firewall's output chain with policy_out
// DROP, as pve-firewall builds PVEFW-HOST-OUT (src/PVE/Firewall.pm
// generate_std_chains: "-o lo -j ACCEPT", ruleset_chain_add_conn_filters
// dropping INVALID and accepting RELATED,ESTABLISHED, then the node's OUT
// rules compiled by ruleset_generate_rule with no conntrack match, then
// "-d $localnet --dport 8006/22" (the node as a client), then policy_out)
// and proxmox-firewall's output chain likewise (default-out's ct state vmap,
// cluster-out ending in the cluster's default policy for Out). rules are the
// node firewall rules; their OUT ones are compiled in.
func hostOutChain(t *testing.T, rules []mgmtport.Rule) string {
	t.Helper()
	var local strings.Builder
	for _, r := range rules {
		if r.Type != "out" || !r.Enable {
			continue
		}
		if r.Action != "ACCEPT" || r.Proto != "tcp" || r.DPort != "" || strings.ContainsAny(r.SPort, ",:") {
			t.Fatalf("the model compiles single-port tcp ACCEPT rules only: %+v", r)
		}
		m := ""
		if r.Iface != "" {
			m = fmt.Sprintf(`oifname %q `, r.Iface)
		}
		fmt.Fprintf(&local, "\t\t%stcp sport %s accept\n", m, r.SPort)
	}
	return `table inet pvefwsim {
	chain out {
		type filter hook output priority 0; policy drop;
		oifname "lo" accept
		ct state invalid drop
		ct state related,established accept
` + local.String() + `		ip daddr 192.0.2.0/24 tcp dport { 8006, 22 } accept
	}
}`
}

// TestMgmtRepliesPassHostPolicyOutDrop: the guard's mgmt-notrack-out makes
// the node's replies from 8006 and 22 untracked, so the host firewall's
// output chain no longer sees them as ESTABLISHED; with the cluster's
// policy_out DROP (a documented cluster option) they pass only through the
// stateless node OUT rules the management-port converger writes. Without
// those rules the operator is locked out of the node's API and SSH.
func TestMgmtRepliesPassHostPolicyOutDrop(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	mc := plugGuest(t, n, "mgmtc0", "eth0", "192.0.2.10", "")
	serveMgmt(t, n, "192.0.2.2:8006")
	// eth0 carries the default route: the converger's interface
	n.NFT(t, hostOutChain(t, mgmtport.New(nil, 0, nil).Desired("eth0")))
	if _, err := connectMgmt(mc.ns, "192.0.2.2:8006"); err != nil {
		t.Fatalf("without the guard, management port with policy_out DROP: %v", err)
	}
	startGuard(t, n, cfg)
	if _, err := connectMgmt(mc.ns, "192.0.2.2:8006"); err != nil {
		t.Errorf("with the guard, the node's API no longer answers under the host firewall's policy_out DROP: %v", err)
	}
	// the converger's rules are what carries them: without its OUT rules
	// the same chain drops the untracked replies
	n.NFT(t, "flush table inet pvefwsim")
	n.NFT(t, hostOutChain(t, mgmtport.New(nil, 0, nil).Desired("")))
	if _, err := connectWithin(mc.ns, "192.0.2.2:8006", 2*time.Second); err == nil {
		t.Error("untracked replies passed policy_out DROP without the converger's OUT rules: the test proves nothing")
	}
}
