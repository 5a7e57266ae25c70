package daemon

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// runningConfig writes an SDN running config with one simple zone per
// vnet ("z" + the vnet's id after its first letter).
func writeRunningConfig(t *testing.T, path string, version int, vnets []string) {
	t.Helper()
	var z, v []string
	for _, id := range vnets {
		z = append(z, fmt.Sprintf(`"z%s":{"type":"simple"}`, id[1:]))
		v = append(v, fmt.Sprintf(`%q:{"type":"vnet","zone":"z%s"}`, id, id[1:]))
	}
	doc := fmt.Sprintf(`{"version":%d,"zones":{"ids":{%s}},"vnets":{"ids":{%s}}}`, version, strings.Join(z, ","), strings.Join(v, ","))
	if err := os.WriteFile(path+".tmp", []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// addBridge adds an up vnet bridge with its gateway address (and, when
// port is set, a guest port on it).
func addBridge(t *testing.T, h *netlink.Handle, name string, i int, port string) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatalf("add %s: %v", name, err)
	}
	a, _ := netlink.ParseAddr(fmt.Sprintf("10.%d.%d.1/24", 16+i/256, i%256))
	if err := h.AddrAdd(br, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	if port == "" {
		return
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index}, PeerName: "p" + port[3:]}
	if err := h.LinkAdd(v); err != nil {
		t.Fatalf("add %s: %v", port, err)
	}
}

// zonePeers reads @zone_peers from the kernel ("a . b" -> true).
func zonePeers(t *testing.T, ns netns.NsHandle) map[string]bool {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.GetSetByName(&nftables.Table{Name: firewall.TableName, Family: nftables.TableFamilyINet}, firewall.SetZonePeers)
	if err != nil {
		t.Fatal(err)
	}
	els, err := c.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	name := func(b []byte) string { return strings.TrimRight(string(b), "\x00") }
	for _, e := range els {
		if len(e.Key) == 32 {
			out[name(e.Key[:16])+" . "+name(e.Key[16:])] = true
		}
	}
	return out
}

// memoryHigh reads MemoryHigh from the packaged unit.
func memoryHigh(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "..", "..", "packaging", "deb", "pve-inspectd.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "MemoryHigh=")
		if !ok {
			continue
		}
		mult := uint64(1)
		for suffix, m := range map[string]uint64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
			if s, ok := strings.CutSuffix(v, suffix); ok {
				v, mult = s, m
			}
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("MemoryHigh=%s: %v", v, err)
		}
		return n * mult
	}
	t.Fatal("the unit has no MemoryHigh")
	return 0
}

// peakRSS is this process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestRunAtScaleOnBed runs the daemon on a node with 2000 zone bridges,
// each with a guest port, its zones from Proxmox's SDN running config;
// then 50 new vnets arrive at once (the running config, then their
// bridges with a guest port each). Each reaches its zone in @zone_peers
// and its port is guarded (the kernel's table equal to the desired one
// is Verify's part), the guard's Verify
// finds nothing to repair, no repair was counted, and the process stayed
// within the unit's MemoryHigh (the test process's peak: an upper bound
// of the daemon's). Times are the bench's (bench/scale), not asserted.
func TestRunAtScaleOnBed(t *testing.T) {
	if testing.Short() {
		t.Skip("2000 bridges: not with -short")
	}
	const bridges, burst = 2000, 50
	ns := testkit.NewNetNS(t, "pdn").Handle()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil || h.LinkSetUp(lo) != nil {
		t.Fatalf("lo: %v", err)
	}
	addBridge(t, h, "eth0", 4000, "") // 10.31.160.1/24
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("10.31.160.254"), Flags: int(netlink.FLAG_ONLINK),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}); err != nil {
		t.Fatalf("default route: %v", err)
	}
	var vnets []string
	for i := range bridges {
		v := fmt.Sprintf("v%04d", i)
		addBridge(t, h, v, i, fmt.Sprintf("tap%di0", 1000+i))
		vnets = append(vnets, v)
	}
	cfg := config.Default()
	testParts(t, &cfg)
	cfg.Guard.MgmtRules = false
	cfg.Guard.NodeRoot = t.TempDir()
	cfg.Guard.SDNConfig = filepath.Join(t.TempDir(), "running-config")
	writeRunningConfig(t, cfg.Guard.SDNConfig, 1, vnets)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	var guard *firewall.Guard
	d := &Daemon{Config: cfg, GuardOptions: []firewall.Option{firewall.WithNetNS(ns)}, EgressNS: &ns,
		Ready: func() { close(ready) }, guardHook: func(g *firewall.Guard) { guard = g }}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run ended before ready: %v", err)
	case <-time.After(5 * time.Minute):
		t.Fatal("no readiness")
	}

	var added []string
	for i := range burst {
		added = append(added, fmt.Sprintf("n%04d", i))
	}
	writeRunningConfig(t, cfg.Guard.SDNConfig, 2, append(vnets, added...))
	for i, v := range added {
		addBridge(t, h, v, bridges+i, fmt.Sprintf("tap%di0", 9000+i))
	}
	missing := added
	for deadline := time.Now().Add(2 * time.Minute); len(missing) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("not in their zone or not guarded: %v", missing)
		}
		time.Sleep(200 * time.Millisecond)
		peers := zonePeers(t, ns)
		guarded := guard.BridgeDesired().Set(firewall.SetGuestPorts).Text
		missing = missing[:0:0]
		for i, v := range added {
			if !peers[v+" . "+v] {
				missing = append(missing, v)
			}
			if p := fmt.Sprintf("tap%di0", 9000+i); !slices.Contains(guarded, p) {
				missing = append(missing, "guest port "+p)
			}
		}
	}
	if err := guard.Verify(ctx); err != nil {
		t.Fatalf("verify after the burst: %v", err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(guard.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasSuffix(mf.GetName(), "repairs_total") {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() != 0 {
				t.Errorf("%s %v = %v: the guard repaired its table", mf.GetName(), m.GetLabel(), m.GetCounter().GetValue())
			}
		}
	}
	if peak, high := peakRSS(t), memoryHigh(t); peak >= high {
		t.Errorf("peak resident set %d MiB, the unit's MemoryHigh is %d MiB", peak>>20, high>>20)
	} else {
		t.Logf("peak resident set %d MiB (MemoryHigh %d MiB)", peak>>20, high>>20)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
