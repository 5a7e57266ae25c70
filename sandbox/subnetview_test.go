package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
)

// countingProxmox is the fake node counting the SDN listings as the
// Proxmox API gets them: GET /cluster/sdn/vnets (vnets) and one GET
// /cluster/sdn/vnets/{vnet}/subnets per vnet read (subnetGets), the way
// pveapi.Client sends them. Before it creates its subnet's range, it runs
// onCreate once, if set (another client of the cluster).
type countingProxmox struct {
	*apitest.Proxmox
	mu         sync.Mutex
	vnets      int
	subnetGets int
	onCreate   func(s sandbox.SubnetSpec)
}

func (c *countingProxmox) ListVNets(ctx context.Context) ([]sandbox.VNetInfo, error) {
	c.mu.Lock()
	c.vnets++
	c.mu.Unlock()
	return c.Proxmox.ListVNets(ctx)
}

func (c *countingProxmox) VNetSubnets(ctx context.Context, vnet string) ([]string, error) {
	c.mu.Lock()
	c.subnetGets++
	c.mu.Unlock()
	return c.Proxmox.VNetSubnets(ctx, vnet)
}

func (c *countingProxmox) CreateSubnet(ctx context.Context, s sandbox.SubnetSpec) error {
	c.mu.Lock()
	f := c.onCreate
	c.onCreate = nil
	c.mu.Unlock()
	if f != nil {
		f(s)
	}
	return c.Proxmox.CreateSubnet(ctx, s)
}

func (c *countingProxmox) counts() (vnets, subnetGets int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.vnets, c.subnetGets
}

func newCountingEngine(t *testing.T, node string, pool netip.Prefix) (*sandbox.Engine, *countingProxmox) {
	t.Helper()
	g := apitest.NewGuests()
	px := &countingProxmox{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000})}
	e, err := sandbox.New(sandbox.Options{Node: node, Proxmox: px, Guests: g.Dial, StateDir: t.TempDir(), AgentTimeout: 2 * time.Second,
		AutoCIDRPool: pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return e, px
}

// TestSequentialCreatesReadSubnetsOnce: the k-th of N creates on one node
// reads the subnets of its own new vnet and of none of the k-1 vnets the
// sandboxes before it have, so a create's requests do not grow with the
// sandboxes there are (before the cache, the k-th read every vnet twice:
// 2k-1 subnet listings, N² for N creates).
func TestSequentialCreatesReadSubnetsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, px := newCountingEngine(t, "node1", netip.Prefix{})
	const n = 12
	var per []int
	for range n {
		_, before := px.counts()
		if _, err := e.Create(ctx, oneVM("debian")); err != nil {
			t.Fatal(err)
		}
		_, after := px.counts()
		per = append(per, after-before)
	}
	vnets, gets := px.counts()
	for k, c := range per {
		if c > 2 {
			t.Fatalf("subnet listings per create: %v (%d in all, %d vnet listings): create %d made %d, want at most 2 whatever the sandboxes before it", per, gets, vnets, k+1, c)
		}
	}
	t.Logf("%d creates: %d vnet listings, %d subnet listings (per create %v)", n, vnets, gets, per)
}

// TestSubnetAddedBehindTheCacheBacksOff: another client adds the range a
// create picked to a vnet that exists and whose subnets this engine has
// read before (a foreign vnet with a subnet, one without, another node's
// sandbox's vnet still without its subnet), at the moment the create
// makes its own: the contested check reads that vnet again, and the
// create backs off to another range on a vnet of a new name.
func TestSubnetAddedBehindTheCacheBacksOff(t *testing.T) {
	cases := []struct {
		name string
		vnet sandbox.VNetInfo
		has  string // the vnet's subnet before, if any
	}{
		{"foreign vnet with a subnet", sandbox.VNetInfo{ID: "lan", Zone: "lanz", Alias: "office"}, "10.9.0.0/24"},
		{"foreign vnet without a subnet", sandbox.VNetInfo{ID: "lan", Zone: "lanz"}, ""},
		{"another node's sandbox's vnet", sandbox.VNetInfo{ID: "vother10", Zone: "sbother1", Alias: "pvei-n-node2 pvei-s-sbother1"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			e, px := newCountingEngine(t, "node1", netip.Prefix{})
			if err := px.CreateZone(ctx, sandbox.ZoneSpec{ID: tc.vnet.Zone}); err != nil {
				t.Fatal(err)
			}
			if err := px.CreateVNet(ctx, sandbox.VNetSpec(tc.vnet)); err != nil {
				t.Fatal(err)
			}
			if tc.has != "" {
				if err := px.Proxmox.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: tc.vnet.ID, CIDR: tc.has}); err != nil {
					t.Fatal(err)
				}
			}
			// A first create reads every vnet, the other client's too.
			if _, err := e.Create(ctx, oneVM("debian")); err != nil {
				t.Fatal(err)
			}
			var taken string
			px.mu.Lock()
			px.onCreate = func(s sandbox.SubnetSpec) {
				taken = s.CIDR
				if err := px.Proxmox.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: tc.vnet.ID, CIDR: s.CIDR}); err != nil {
					t.Error(err)
				}
			}
			px.mu.Unlock()
			sb, err := e.Create(ctx, oneVM("debian"))
			if err != nil {
				t.Fatal(err)
			}
			got := netip.MustParsePrefix(sb.Networks[0].CIDR)
			if taken == "" || got.Overlaps(netip.MustParsePrefix(taken)) {
				t.Fatalf("the create kept %s, which the other client took on %s (%q)", got, tc.vnet.ID, taken)
			}
			if first := "v" + sb.ID[2:] + "0"; sb.Networks[0].VNet == first {
				t.Errorf("the create stayed on its first vnet %s: no back-off", first)
			}
		})
	}
}

// TestAutoRangesStartAtTheNode: each node's search for a free "auto"
// range starts at a place in the pool of its own (the same on each
// start), and wraps around the pool's end: three nodes' first sandboxes
// get three ranges, and one node's sandboxes take the pool's ranges in
// turn from its first until none is left.
func TestAutoRangesStartAtTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := func(node string, pool netip.Prefix) netip.Prefix {
		e, _ := newCountingEngine(t, node, pool)
		sb, err := e.Create(ctx, oneVM("debian"))
		if err != nil {
			t.Fatal(err)
		}
		return netip.MustParsePrefix(sb.Networks[0].CIDR)
	}
	pool := netip.MustParsePrefix("10.200.0.0/16")
	seen := map[netip.Prefix]string{}
	for _, node := range []string{"pve1", "pve2", "pve3"} {
		p := first(node, pool)
		if !pool.Contains(p.Addr()) || p.Bits() != 24 {
			t.Fatalf("%s: %s, want a /24 of %s", node, p, pool)
		}
		if other, ok := seen[p]; ok {
			t.Errorf("%s and %s both start at %s", node, other, p)
		}
		seen[p] = node
		if again := first(node, pool); again != p {
			t.Errorf("%s: first range %s, then %s on another start", node, p, again)
		}
	}

	small := netip.MustParsePrefix("10.201.0.0/22")
	for _, node := range []string{"pve1", "pve2", "pve3"} {
		e, _ := newCountingEngine(t, node, small)
		var got []int
		for range 4 {
			sb, err := e.Create(ctx, oneVM("debian"))
			if err != nil {
				t.Fatalf("%s: %v", node, err)
			}
			got = append(got, int(netip.MustParsePrefix(sb.Networks[0].CIDR).Addr().As4()[2]))
		}
		for i := 1; i < len(got); i++ {
			if got[i] != (got[0]+i)%4 {
				t.Errorf("%s: third octets %v, want the four ranges in turn from the first, wrapping", node, got)
			}
		}
		if _, err := e.Create(ctx, oneVM("debian")); !errors.Is(err, sandbox.ErrNoFreeRange) {
			t.Errorf("%s: a fifth create in a pool of four: %v, want ErrNoFreeRange", node, err)
		}
	}
}
