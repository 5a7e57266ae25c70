package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// runningConfig renders an SDN running config as pve-network's
// commit_config writes it (one JSON object: version, and zones, vnets,
// subnets, controllers, fabrics keyed by "ids"). vnets maps a vnet to its
// zone and subnet.
func runningConfig(version int, zones []string, vnets map[string][2]string) string {
	var z, v, s []string
	for _, id := range zones {
		z = append(z, fmt.Sprintf(`%q:{"dhcp":"dnsmasq","ipam":"pve","type":"simple"}`, id))
	}
	for id, zs := range vnets {
		v = append(v, fmt.Sprintf(`%q:{"type":"vnet","zone":%q}`, id, zs[0]))
		p := netip.MustParsePrefix(zs[1])
		s = append(s, fmt.Sprintf(`"%s-%s-%d":{"gateway":"%s","snat":1,"type":"subnet","vnet":%q}`,
			zs[0], p.Addr(), p.Bits(), p.Addr().Next(), id))
	}
	return fmt.Sprintf(`{"controllers":{"ids":{}},"fabrics":{"ids":{}},"subnets":{"ids":{%s}},"version":%d,"vnets":{"ids":{%s}},"zones":{"ids":{%s}}}`,
		strings.Join(s, ","), version, strings.Join(v, ","), strings.Join(z, ","))
}

// pluginVNet is a vnet of the bed in 10.30.<n>.0/24.
func pluginVNet(name string, n byte) testvm.VNet {
	return testvm.VNet{Name: name, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 30, n, 0}), 24),
		Gateway: netip.AddrFrom4([4]byte{10, 30, n, 1}),
		DHCP:    []testvm.DHCPRange{{Start: netip.AddrFrom4([4]byte{10, 30, n, 100}), End: netip.AddrFrom4([4]byte{10, 30, n, 200})}}, SNAT: true}
}

// listenIn opens a TCP listener in a guest's namespace that accepts and
// closes connections until the test ends; it returns the guest's address.
func listenIn(t *testing.T, b *testvm.Bed, g *testvm.Guest) string {
	t.Helper()
	var ln net.Listener
	if err := b.Do(g.NS, func() (err error) { ln, err = net.Listen("tcp", ":7000"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return net.JoinHostPort(g.IPv4().String(), "7000")
}

// waitDefaultRoute waits until DHCP has also set the guest's default route,
// so a probe's timeout means a drop and not a guest still configuring.
func waitDefaultRoute(t *testing.T, ctx context.Context, g *testvm.Guest) {
	t.Helper()
	for {
		out, err := exec.CommandContext(ctx, "ip", "-n", g.NS, "-4", "route", "show", "default").Output()
		if err == nil && strings.TrimSpace(string(out)) != "" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("guest %d: no default route from DHCP: %v", g.VMID, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func dialFromGuest(b *testvm.Bed, g *testvm.Guest, addr string) error {
	return b.Do(g.NS, func() error {
		c, err := net.DialTimeout("tcp", addr, 1500*time.Millisecond)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// scrape returns the daemon's metrics over a connection dialled inside
// the node namespace (the HTTP transport's own dials would leave it).
func scrape(b *testvm.Bed) (string, error) {
	var conn net.Conn
	if err := b.Do(b.NodeNS(), func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(testvm.NodeMgmtAddr, fmt.Sprint(accMetricsPort)), 3*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
	resp, err := (&http.Client{Transport: tr, Timeout: 3 * time.Second}).Get("http://node/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// TestAcceptanceSDNZonesOnBed runs the daemon beside the zones the
// reference Inspect plugin creates (zone abc123z with vnets abc123v0 and
// abc123v1, a second zone xyz456z), learned only from an SDN running
// config file: vnets of one zone reach each other, the other zone stays
// cut, a vnet added to the file later joins its zone without a restart,
// and a garbled file changes nothing.
func TestAcceptanceSDNZonesOnBed(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// The bed's zones only group dnsmasq instances; the guard learns
	// zones from the file alone.
	for _, z := range []testvm.Zone{
		{ID: "abc123z", VNets: []testvm.VNet{pluginVNet("abc123v0", 0), pluginVNet("abc123v1", 1)}},
		{ID: "xyz456z", VNets: []testvm.VNet{pluginVNet("xyz456v0", 2)}},
	} {
		if err := b.AddZone(ctx, z); err != nil {
			t.Fatal(err)
		}
	}
	guests := map[string]*testvm.Guest{}
	for i, vn := range []string{"abc123v0", "abc123v1", "xyz456v0"} {
		g, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101 + i, VNet: vn})
		if err != nil {
			t.Fatal(err)
		}
		guests[vn] = g
	}
	addr := map[string]string{}
	for vn, g := range guests {
		addr[vn] = listenIn(t, b, g)
	}

	// The bed keeps the VM configs and dnsmasq leases the layer-2 guard
	// maps guest ports from (b.NodeRoot()); the SDN file lives beside.
	sdn := filepath.Join(t.TempDir(), "etc", "pve", "sdn", ".running-config")
	if err := os.MkdirAll(filepath.Dir(sdn), 0o755); err != nil {
		t.Fatal(err)
	}
	vnets := map[string][2]string{"abc123v0": {"abc123z", "10.30.0.0/24"}, "abc123v1": {"abc123z", "10.30.1.0/24"},
		"xyz456v0": {"xyz456z", "10.30.2.0/24"}}
	writeSDN := func(doc string) {
		t.Helper()
		if err := os.WriteFile(sdn+".tmp", []byte(doc), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(sdn+".tmp", sdn); err != nil {
			t.Fatal(err)
		}
	}
	writeSDN(runningConfig(1, []string{"abc123z", "xyz456z"}, vnets))
	cfg := writeAccConfig(t, b, fmt.Sprintf("sdn_config = %q", sdn))
	a := &accBed{b: b, cfg: cfg}
	top := t // listeners opened in subtests live until the whole test ends
	a.startDaemon(t, ctx)

	// expect checks every ordered pair of guests: reach lists the pairs
	// that connect, every other pair must time out (a refusal would mean
	// a route exists).
	expect := func(when string, reach map[[2]string]bool) {
		t.Helper()
		for from, g := range guests {
			for to := range guests {
				if from == to {
					continue
				}
				err := dialFromGuest(b, g, addr[to])
				switch {
				case reach[[2]string{from, to}] && err != nil:
					t.Errorf("%s: %s -> %s: %v, want connected", when, from, to, err)
				case !reach[[2]string{from, to}] && !isTimeout(err):
					t.Errorf("%s: %s -> %s: %v, want a timeout", when, from, to, err)
				}
			}
		}
	}
	sameZone := map[[2]string]bool{{"abc123v0", "abc123v1"}: true, {"abc123v1", "abc123v0"}: true}
	expect("running", sameZone)
	if t.Failed() { // say what the guards held when it failed
		m, _ := scrape(b)
		for _, l := range strings.Split(m, "\n") {
			if strings.HasPrefix(l, "pve_inspect_guard_bridge_unmapped_ports") || strings.HasPrefix(l, "pve_inspect_sdn_zones") {
				t.Log(l)
			}
		}
		l2, _ := a.nodeNFT(ctx, "list", "table", "bridge", "pve-inspect")
		zp, _ := a.nodeNFT(ctx, "list", "set", "inet", "pve-inspect", "zone_peers")
		t.Logf("zone_peers:\n%s\nlayer-2 table:\n%s", zp, l2)
	}

	t.Run("vnet added to the file later joins its zone", func(t *testing.T) {
		if err := b.AddZone(ctx, testvm.Zone{ID: "abc123b", VNets: []testvm.VNet{pluginVNet("abc123v2", 3)}}); err != nil {
			t.Fatal(err)
		}
		g, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 104, VNet: "abc123v2"})
		if err != nil {
			t.Fatal(err)
		}
		waitDefaultRoute(t, ctx, g) // DHCP gave the address; its router option may land a moment later
		guests["abc123v2"], addr["abc123v2"] = g, listenIn(top, b, g)
		expect("new bridge, zone not known yet", sameZone)
		vnets["abc123v2"] = [2]string{"abc123z", "10.30.3.0/24"}
		writeSDN(runningConfig(2, []string{"abc123z", "xyz456z"}, vnets))
		deadline := time.Now().Add(time.Minute)
		for dialFromGuest(b, g, addr["abc123v0"]) != nil {
			if time.Now().After(deadline) {
				t.Fatal("abc123v2 did not join abc123z within a minute of the file change")
			}
			time.Sleep(500 * time.Millisecond)
		}
		sameZone = map[[2]string]bool{}
		for _, x := range []string{"abc123v0", "abc123v1", "abc123v2"} {
			for _, y := range []string{"abc123v0", "abc123v1", "abc123v2"} {
				sameZone[[2]string{x, y}] = x != y
			}
		}
		expect("after the vnet joined", sameZone)
	})

	t.Run("garbled file changes nothing", func(t *testing.T) {
		before, err := a.nodeNFT(ctx, "list", "set", "inet", "pve-inspect", "zone_peers")
		if err != nil {
			t.Fatal(err)
		}
		writeSDN(`{"version":3,"zones":{"ids":{"abc123z":{"type":"simple"`)
		deadline := time.Now().Add(time.Minute)
		for {
			m, err := scrape(b)
			if err == nil && strings.Contains(m, `pve_inspect_sdn_config_errors_total{reason="parse"} 1`) &&
				strings.Contains(m, "pve_inspect_sdn_config_valid 0") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the daemon did not report the garbled file within a minute (%v):\n%s", err, m)
			}
			time.Sleep(500 * time.Millisecond)
		}
		after, err := a.nodeNFT(ctx, "list", "set", "inet", "pve-inspect", "zone_peers")
		if err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Errorf("zone_peers changed after a garbled file:\nbefore %s\nafter %s", before, after)
		}
		expect("after the garbled file", sameZone)
	})
}
