package firewall

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestNodeConnLimitAcrossZones: each zone stays under its own conn_limit,
// yet together they meet node_conn_limit, and the guests' new connections
// beyond it are dropped whichever zone opens them (pve-firewall's default
// nf_conntrack_max of 262144 is otherwise filled by 16 zones at 16384).
func TestNodeConnLimitAcrossZones(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.Zones = map[string][]string{"zone1": {"vnetA"}, "zone2": {"vnetB"}}
	const nodeLimit = 40
	cfg.Flood = FloodConfig{ConnLimit: 1000, NodeConnLimit: nodeLimit}
	ga := plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
	gb := plugGuest(t, n, "tap902i0", "vnetB", "10.10.2.50", "10.10.2.1")
	for _, a := range []string{"10.10.1.1:53", "10.10.2.1:53"} {
		testkit.ServeDNS(t, n.ListenPacket(t, "udp4", a), testkit.DNSZone{})
	}
	g := startGuard(t, n, cfg)
	if err := g.SetPorts(context.Background(), []Port{{Name: ga.port, MAC: ga.mac, IPv4: []netip.Addr{ga.addr}},
		{Name: gb.port, MAC: gb.mac, IPv4: []netip.Addr{gb.addr}}}); err != nil {
		t.Fatal(err)
	}

	if err := udpFlows(ga.ns, "10.10.1.1:53", 30, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := udpFlows(gb.ns, "10.10.2.1:53", 30, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	a, b := conntrackLines(t, n, "src=10.10.1.50"), conntrackLines(t, n, "src=10.10.2.50")
	t.Logf("tracked: zone A %d, zone B %d (node limit %d, per-interface 1000)", a, b, nodeLimit)
	if a < 30 {
		t.Errorf("zone A holds %d tracked flows, want its 30 (under both limits)", a)
	}
	if a+b > nodeLimit+2 {
		t.Errorf("guests hold %d tracked connections, want at most the node limit %d", a+b, nodeLimit)
	}
	cs := counters(t, n, cfg)
	if cs["node-flood-conns"] == 0 || cs["guest-flood-conns"] != 0 {
		t.Errorf("counters node-flood-conns %d guest-flood-conns %d, want the node bound's to move, not the interface's",
			cs["node-flood-conns"], cs["guest-flood-conns"])
	}
}

func TestCheckNodeConnLimit(t *testing.T) {
	cases := []struct {
		name  string
		max   string // "" for no file
		limit uint32
		want  error
	}{
		{"below", "262144\n", 0, nil},
		{"equal", "131072\n", 0, ErrNodeConnLimit},
		{"above", "65536\n", 100000, ErrNodeConnLimit},
		{"configured below", "65536\n", 1000, nil},
		{"no conntrack", "", 0, os.ErrNotExist},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.max != "" {
				p := filepath.Join(root, "sys/net/netfilter/nf_conntrack_max")
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(tc.max), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := CheckNodeConnLimit(root, FloodConfig{NodeConnLimit: tc.limit})
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
