package e2e_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// bedZoneDomain is the zones' DNS domain of the bed's resolver
// ([egress] zone_domain = "{zone}.sandbox.test"): VM names answer under
// it too.
func bedZoneDomain(zone string) string { return zone + ".sandbox.test" }

// start gives the bed's guard its egress registry (node default open)
// and runs the daemon's resolver for it in the node's namespace, on the
// guard's DNS port, as the daemon does: the guard redirects the DNS of
// the sandboxes' zones to it (every mode: open ones' to their gateway),
// so without it they would have none. Both stop when the test ends.
func (r *registryEgress) start(t *testing.T, ctx context.Context, e *bedEnv, g *firewall.Guard) {
	t.Helper()
	reg := egress.NewRegistry(g, egress.Rules{Mode: firewall.EgressOpen}, nil)
	r.mu.Lock()
	r.reg = reg
	r.mu.Unlock()
	node, err := netns.GetFromName(e.bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	links, err := egress.NewNetlinkLinks(node)
	node.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(links.Close)
	ec := firewall.EgressConfig{}
	mark := ec.ResolverMark()
	dial := func(ctx context.Context, network, address string) (c net.Conn, err error) {
		err = e.bed.Do(e.bed.NodeNS(), func() error {
			d := net.Dialer{Control: egress.MarkControl(mark)}
			c, err = d.DialContext(ctx, network, address)
			return err
		})
		return c, err
	}
	res := egress.NewResolver(egress.ResolverConfig{Upstreams: []string{testvm.InternetAddr + ":53"}, Mark: mark,
		Dial: dial, Timeout: 2 * time.Second, Domain: bedZoneDomain}, reg, links, egress.NewDenials(), nil, testkit.FailureLog(t))
	dnsPort, _ := ec.Ports()
	var pc net.PacketConn
	var ln net.Listener
	if err := e.bed.Do(e.bed.NodeNS(), func() (err error) {
		if pc, err = egress.ListenUDP(ctx, fmt.Sprintf(":%d", dnsPort)); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", dnsPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, serve := range []func() error{
		func() error { return res.ServeUDP(sctx, pc) },
		func() error { return res.ServeTCP(sctx, ln) },
	} {
		wg.Go(func() {
			if err := serve(); err != nil {
				t.Errorf("bed resolver: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		wg.Wait()
		_ = pc.Close()
	})
}
