package testvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/deathsig"
)

// VNet is one SDN vnet: a bridge on the node with the gateway address.
type VNet struct {
	Name    string       // bridge name on the node, at most 15 characters
	Subnet  netip.Prefix // e.g. 10.10.1.0/24
	Gateway netip.Addr   // e.g. 10.10.1.1, put on the bridge
	DHCP    []DHCPRange  // the ranges handed out, in order (none: see StaticDHCP)
	SNAT    bool         // masquerade guest traffic out of the management NIC
	// StaticDHCP serves a vnet without ranges over its whole subnet to the
	// MACs mapped to an address (a static dhcp-range: only ethers lines
	// with an address get a lease), as a current Proxmox zone's dnsmasq
	// serves every subnet of a DHCP zone (pve-network Dnsmasq.pm
	// configure_subnet) and its IPAM maps a NIC there to an address of the
	// prefix (Ipams/PVEPlugin.pm add_next_freeip). Unset, a vnet without
	// ranges gets DNS only.
	StaticDHCP bool
}

// DHCPRange is one range of addresses a vnet's DHCP hands out, both ends
// included (one dhcp-range entry of a Proxmox subnet).
type DHCPRange struct {
	Start, End netip.Addr
}

// Zone is one SDN zone: its vnets share one dnsmasq for DHCP and DNS.
type Zone struct {
	ID    string
	VNets []VNet
}

type zoneState struct {
	zone    Zone
	dnsmasq *exec.Cmd
	done    chan struct{}
}

var (
	zoneIDRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)
	ifnameRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_.-]{0,14}$`)
)

// LocalName is the name a zone's resolver answers locally (A = the
// gateway of the zone's first vnet), a positive control for DNS.
func LocalName(zoneID string) string { return "gateway." + zoneID + ".test" }

// ULAPrefix is the routed IPv6 prefix of a vnet, derived from its IPv4
// subnet: 10.A.B.0/24 gets fd42:0:A:B::/64.
func ULAPrefix(v VNet) netip.Prefix {
	a := v.Subnet.Addr().As4()
	return netip.MustParsePrefix(fmt.Sprintf("fd42:0:%x:%x::/64", a[1], a[2]))
}

func ulaAddr(v VNet, host int) netip.Addr {
	p := ULAPrefix(v).Addr().As16()
	p[14], p[15] = byte(host>>8), byte(host)
	return netip.AddrFrom16(p)
}

// HasDHCP reports whether the vnet has a DHCP range. A Proxmox subnet
// without dhcp-range is valid (pve-network SubnetPlugin.pm: dhcp-range
// optional); in a DHCP zone its guests still get the address the IPAM
// maps (StaticDHCP).
func (v VNet) HasDHCP() bool { return len(v.DHCP) > 0 }

// leases reports whether the vnet's dnsmasq hands a lease to a MAC mapped
// to ip (zero: mapped without an address): any such MAC on a vnet with
// ranges, only one mapped to an address on a vnet served by a static
// range.
func (v VNet) leases(ip netip.Addr) bool { return v.HasDHCP() || v.StaticDHCP && ip.IsValid() }

func (v VNet) validate() error {
	switch {
	case !ifnameRE.MatchString(v.Name):
		return fmt.Errorf("vnet name %q: not an interface name", v.Name)
	case !v.Subnet.IsValid() || !v.Subnet.Addr().Is4():
		return fmt.Errorf("vnet %s: subnet must be IPv4", v.Name)
	case !v.Subnet.Contains(v.Gateway):
		return fmt.Errorf("vnet %s: gateway %s outside %s", v.Name, v.Gateway, v.Subnet)
	case v.StaticDHCP && v.HasDHCP():
		return fmt.Errorf("vnet %s: a static DHCP range and ranges", v.Name)
	}
	for _, r := range v.DHCP {
		if !v.Subnet.Contains(r.Start) || !v.Subnet.Contains(r.End) || r.End.Less(r.Start) {
			return fmt.Errorf("vnet %s: bad DHCP range %s-%s", v.Name, r.Start, r.End)
		}
	}
	return nil
}

// AddZone creates the zone's bridges (with gateway addresses, IPv4 and the
// vnet's ULA), its SNAT rules and its dnsmasq.
func (b *Bed) AddZone(ctx context.Context, z Zone) error {
	b.zoneOps.Lock()
	defer b.zoneOps.Unlock()
	if err := z.validate(); err != nil {
		return err
	}
	return b.addZoneLocked(ctx, z)
}

// ApplyZone makes z the configuration of the zone of its id, as a Proxmox
// node's network reload does for a zone it already runs: the bridges of
// vnets it keeps stay, with their ports (a running guest stays attached),
// and get z's addresses (ifreload changes a bridge's addresses in place;
// ifupdown2, from memory), the bridges of vnets it lost go, new vnets get
// theirs, and the zone's dnsmasq starts again with its DHCP host mappings
// (ethers) and leases kept (pve-network Dhcp/Dnsmasq.pm before_configure
// rewrites the zone's configuration and unlinks only its 10-*.conf files).
// A zone the bed does not run is added (AddZone).
func (b *Bed) ApplyZone(ctx context.Context, z Zone) error {
	b.zoneOps.Lock()
	defer b.zoneOps.Unlock()
	if err := z.validate(); err != nil {
		return err
	}
	b.mu.Lock()
	zs, ok := b.zones[z.ID]
	b.mu.Unlock()
	if !ok {
		return b.addZoneLocked(ctx, z)
	}
	b.stopDnsmasq(zs)
	node := b.NodeNS()
	for _, v := range zs.zone.VNets {
		if !z.hasVNet(v.Name) {
			if err := run(ctx, "ip", "-n", node, "link", "del", v.Name); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
				return fmt.Errorf("testvm: zone %s: %w", z.ID, err)
			}
		}
	}
	for _, v := range z.VNets {
		if !zs.zone.hasVNet(v.Name) {
			if err := b.addVNet(ctx, z.ID, v); err != nil {
				return err
			}
			continue
		}
		if err := run(ctx, "ip", "-n", node, "addr", "flush", "dev", v.Name, "scope", "global"); err != nil {
			return fmt.Errorf("testvm: zone %s: %w", z.ID, err)
		}
		if err := b.addressVNet(ctx, z.ID, v); err != nil {
			return err
		}
	}
	b.mu.Lock()
	zs.zone = z
	b.mu.Unlock()
	return b.serveZone(ctx, zs)
}

// validate checks a zone's id and vnets.
func (z Zone) validate() error {
	if !zoneIDRE.MatchString(z.ID) {
		return fmt.Errorf("testvm: zone id %q: want 1-8 of [a-z0-9] starting with a letter", z.ID)
	}
	if len(z.VNets) == 0 {
		return fmt.Errorf("testvm: zone %s has no vnets", z.ID)
	}
	for _, v := range z.VNets {
		if err := v.validate(); err != nil {
			return fmt.Errorf("testvm: zone %s: %w", z.ID, err)
		}
	}
	return nil
}

// hasVNet reports whether the zone has a vnet of that name.
func (z Zone) hasVNet(name string) bool {
	for _, v := range z.VNets {
		if v.Name == name {
			return true
		}
	}
	return false
}

// addZoneLocked is AddZone with zoneOps held and z valid.
func (b *Bed) addZoneLocked(ctx context.Context, z Zone) (err error) {
	b.mu.Lock()
	if _, ok := b.zones[z.ID]; ok {
		b.mu.Unlock()
		return fmt.Errorf("testvm: zone %s exists", z.ID)
	}
	zs := &zoneState{zone: z}
	b.zones[z.ID] = zs
	b.mu.Unlock()
	defer func() {
		if err != nil {
			_ = b.removeZoneLocked(context.WithoutCancel(ctx), z.ID)
		}
	}()
	for _, v := range z.VNets {
		if err := b.addVNet(ctx, z.ID, v); err != nil {
			return err
		}
	}
	return b.serveZone(ctx, zs)
}

// addVNet creates a vnet's bridge with its addresses.
func (b *Bed) addVNet(ctx context.Context, zone string, v VNet) error {
	if err := run(ctx, "ip", "-n", b.NodeNS(), "link", "add", v.Name, "type", "bridge"); err != nil {
		return fmt.Errorf("testvm: zone %s: %w", zone, err)
	}
	if err := b.addressVNet(ctx, zone, v); err != nil {
		return err
	}
	if err := run(ctx, "ip", "-n", b.NodeNS(), "link", "set", v.Name, "up"); err != nil {
		return fmt.Errorf("testvm: zone %s: %w", zone, err)
	}
	return nil
}

// addressVNet puts the vnet's gateway and ULA on its bridge.
func (b *Bed) addressVNet(ctx context.Context, zone string, v VNet) error {
	node := b.NodeNS()
	if err := run(ctx, "ip", "-n", node, "addr", "add", netip.PrefixFrom(v.Gateway, v.Subnet.Bits()).String(), "dev", v.Name); err != nil {
		return fmt.Errorf("testvm: zone %s: %w", zone, err)
	}
	// A node that came up with IPv6 off for new interfaces (the guard
	// sets that) keeps the vnet v6-less, as on a real node.
	if err := run(ctx, "ip", "-n", node, "addr", "add", netip.PrefixFrom(ulaAddr(v, 1), 64).String(), "dev", v.Name, "nodad"); err != nil {
		b.log.Info("vnet without IPv6", "vnet", v.Name, "err", err)
	}
	return nil
}

// serveZone brings a zone's SNAT rules and lease link up to date and
// starts its dnsmasq. The dnsmasq of another zone that holds one of its
// gateways (a zone whose subnet moved in the same apply, not yet applied
// again) is stopped first: a Proxmox node's reload has stopped every
// dnsmasq before it configures any zone (pve-network Dhcp.pm
// regenerate_config: before_regenerate, "systemctl stop dnsmasq@*"), so
// an old one never holds the address; that zone's own apply, or the
// reload's restart of every dnsmasq (RestartDnsmasq), starts it again.
func (b *Bed) serveZone(ctx context.Context, zs *zoneState) error {
	z := zs.zone
	if err := b.syncNAT(ctx); err != nil {
		return err
	}
	if err := b.linkLeases(z.ID); err != nil {
		return fmt.Errorf("testvm: zone %s: %w", z.ID, err)
	}
	gateways := map[netip.Addr]bool{}
	for _, v := range z.VNets {
		gateways[v.Gateway] = true
	}
	var holders []*zoneState
	b.mu.Lock()
	for id, o := range b.zones {
		if id != z.ID && slices.ContainsFunc(o.zone.VNets, func(v VNet) bool { return gateways[v.Gateway] }) {
			holders = append(holders, o)
		}
	}
	b.mu.Unlock()
	for _, o := range holders {
		b.stopDnsmasq(o)
	}
	return b.startDnsmasq(ctx, zs)
}

// stopDnsmasq stops a zone's dnsmasq, if it runs; call with zoneOps held.
func (b *Bed) stopDnsmasq(zs *zoneState) {
	b.mu.Lock()
	cmd, done := zs.dnsmasq, zs.done
	zs.dnsmasq = nil
	b.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
		<-done
	}
}

// RemoveZone stops the zone's dnsmasq and deletes its bridges and NAT.
func (b *Bed) RemoveZone(ctx context.Context, id string) error {
	b.zoneOps.Lock()
	defer b.zoneOps.Unlock()
	return b.removeZoneLocked(ctx, id)
}

// removeZoneLocked is RemoveZone with zoneOps held.
func (b *Bed) removeZoneLocked(ctx context.Context, id string) error {
	b.mu.Lock()
	zs, ok := b.zones[id]
	delete(b.zones, id)
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("testvm: zone %s does not exist", id)
	}
	var errs []error
	b.stopDnsmasq(zs)
	for _, v := range zs.zone.VNets {
		if err := run(ctx, "ip", "-n", b.NodeNS(), "link", "del", v.Name); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
	}
	_ = os.Remove(b.leaseFile(id))
	_ = os.Remove(b.ethersFile(id))
	errs = append(errs, b.syncNAT(ctx))
	return errors.Join(errs...)
}

func (b *Bed) leaseFile(zone string) string {
	return filepath.Join(b.dir, "dnsmasq", zone+".leases")
}

// ethersFile is the zone's dnsmasq dhcp-hostsfile: "mac[,ip]" per line,
// Proxmox's /etc/dnsmasq.d/<zone>/ethers.
func (b *Bed) ethersFile(zone string) string {
	return filepath.Join(b.dir, "dnsmasq", zone+".ethers")
}

// addDHCPHost lists mac (with ip, when valid) in the ethers file of the
// zone vnet is in, unless it is there, and has the zone's dnsmasq re-read
// it (SIGHUP), as Proxmox maps a VM's NIC at its start (Dnsmasq.pm
// add_ip_mapping: append to ethers, "systemctl reload dnsmasq@<zone>").
func (b *Bed) addDHCPHost(vnet string, mac net.HardwareAddr, ip netip.Addr) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var zs *zoneState
	for _, z := range b.zones {
		for _, v := range z.zone.VNets {
			if v.Name == vnet {
				zs = z
			}
		}
	}
	if zs == nil {
		return fmt.Errorf("vnet %q does not exist", vnet)
	}
	line := mac.String()
	if ip.IsValid() {
		line += "," + ip.String()
	}
	path := b.ethersFile(zs.zone.ID)
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, l := range strings.Split(string(old), "\n") {
		if l == line {
			return nil
		}
	}
	// A MAC mapped again (an IPAM address that changed) replaces its line,
	// and a line of another MAC with this address goes: the IPAM gave the
	// address out again, so that MAC's entry was deleted (a NIC removed,
	// a VM destroyed), and add_ip_mapping drops every line whose MAC the
	// IPAM's MAC cache no longer holds at that address (pve-network
	// Dnsmasq.pm add_ip_mapping, "delete changed"). Kept, dnsmasq would
	// ignore the new line as a duplicate dhcp-host address. A line of a
	// MAC that still runs is still backed by the IPAM: the address given
	// twice is an IPAM bug, refused here as Proxmox's dnsmasq would leave
	// the new MAC without a lease.
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(old)), "\n") {
		lmac, lip, _ := strings.Cut(l, ",")
		if l == "" || strings.HasPrefix(l, mac.String()) {
			continue
		}
		if ip.IsValid() && lip == ip.String() {
			if vmid, ok := b.runningMAC(lmac); ok {
				return fmt.Errorf("address %s is mapped to %s of running guest %d: given to %s too", ip, lmac, vmid, mac)
			}
			continue
		}
		keep = append(keep, l)
	}
	keep = append(keep, line)
	if err := os.WriteFile(path, []byte(strings.Join(keep, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if zs.dnsmasq != nil && zs.dnsmasq.Process != nil {
		_ = zs.dnsmasq.Process.Signal(syscall.SIGHUP)
	}
	return nil
}

// runningMAC is the VMID of the running guest or container whose NIC has
// mac ("aa:bb:..", as an ethers line writes it); b.mu is held.
func (b *Bed) runningMAC(mac string) (int, bool) {
	for id, g := range b.guests {
		if g.MAC.String() == mac {
			return id, true
		}
	}
	for id, c := range b.cts {
		if c.MAC.String() == mac && c.Alive() {
			return id, true
		}
	}
	return 0, false
}

// RestartDnsmasq stops every zone's dnsmasq, then starts each again (with
// its leases and ethers file kept), as every Proxmox node's network reload
// does on each SDN apply (pve-network Dhcp/Dnsmasq.pm before_regenerate:
// systemctl stop dnsmasq@*; after_configure: restart dnsmasq@<zone>).
// Guests keep their addresses and renew once it is back.
func (b *Bed) RestartDnsmasq(ctx context.Context) error {
	b.zoneOps.Lock()
	defer b.zoneOps.Unlock()
	b.mu.Lock()
	zones := make([]*zoneState, 0, len(b.zones))
	for _, id := range sortedZoneIDs(b.zones) {
		zones = append(zones, b.zones[id])
	}
	b.mu.Unlock()
	for _, zs := range zones {
		b.mu.Lock()
		cmd, done := zs.dnsmasq, zs.done
		b.mu.Unlock()
		if cmd != nil && cmd.Process != nil {
			_ = cmd.Process.Kill()
			<-done
		}
	}
	var errs []error
	for _, zs := range zones {
		b.mu.Lock()
		_, live := b.zones[zs.zone.ID]
		b.mu.Unlock()
		if !live {
			continue
		}
		// A zone removed meanwhile, or its old dnsmasq's sockets not yet
		// released on a loaded machine, fails one start: try again a
		// few times, and a zone gone since is no error.
		var err error
		for attempt := range 5 {
			if err = b.startDnsmasq(ctx, zs); err == nil || ctx.Err() != nil {
				break
			}
			b.mu.Lock()
			_, live = b.zones[zs.zone.ID]
			b.mu.Unlock()
			if !live {
				err = nil
				break
			}
			b.log.Warn("dnsmasq restart failed, retrying", "zone", zs.zone.ID, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func sortedZoneIDs(m map[string]*zoneState) []string {
	out := make([]string, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// DnsmasqPID is the pid of the zone's dnsmasq, or 0.
func (b *Bed) DnsmasqPID(zone string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if zs, ok := b.zones[zone]; ok && zs.dnsmasq != nil && zs.dnsmasq.Process != nil {
		return zs.dnsmasq.Process.Pid
	}
	return 0
}

// startDnsmasq runs the zone's dnsmasq in the node namespace, as Proxmox
// SDN does: DHCP on the zone's bridges, DNS forwarding upstream through the
// SDN resolver file.
func (b *Bed) startDnsmasq(ctx context.Context, zs *zoneState) error {
	z := zs.zone
	args := []string{"netns", "exec", b.NodeNS(), "dnsmasq",
		"--keep-in-foreground", "--conf-file=/dev/null", "--bind-interfaces", "--except-interface=lo",
		"--pid-file=" + filepath.Join(b.dir, "dnsmasq", z.ID+".pid"),
		"--dhcp-leasefile=" + b.leaseFile(z.ID),
		"--resolv-file=" + b.ResolvConf(),
		"--domain=" + z.ID + ".test", "--local=/" + z.ID + ".test/",
		// Only MACs in the zone's ethers file get a lease, as with
		// Proxmox's per-zone dnsmasq (Dnsmasq.pm before_configure).
		"--dhcp-hostsfile=" + b.ethersFile(z.ID), "--dhcp-ignore=tag:!known",
		"--host-record=" + LocalName(z.ID) + "," + z.VNets[0].Gateway.String(),
		"--dhcp-authoritative", "--log-facility=-", "--quiet-dhcp", "--quiet-dhcp6", "--quiet-ra",
	}
	if _, err := user.Lookup("dnsmasq"); err == nil {
		args = append(args, "--user=dnsmasq")
	} else {
		args = append(args, "--user=nobody")
	}
	for _, v := range z.VNets {
		mask := netip.PrefixFrom(v.Subnet.Addr(), v.Subnet.Bits())
		args = append(args, "--interface="+v.Name)
		switch {
		case v.StaticDHCP:
			// the subnet as Dnsmasq.pm configure_subnet writes it: only
			// the addresses of ethers lines are handed out
			args = append(args, fmt.Sprintf("--dhcp-range=set:%s,%s,static,%s,infinite", v.Name, mask.Masked().Addr(), prefixMask(mask)))
		case !v.HasDHCP():
			continue // DNS only: no range, so dnsmasq answers no DHCP there
		}
		// one --dhcp-range per range, all tagged with the vnet's name
		for _, r := range v.DHCP {
			args = append(args, fmt.Sprintf("--dhcp-range=set:%s,%s,%s,%s,1h", v.Name, r.Start, r.End, prefixMask(mask)))
		}
		args = append(args,
			fmt.Sprintf("--dhcp-option=tag:%s,option:router,%s", v.Name, v.Gateway),
			fmt.Sprintf("--dhcp-option=tag:%s,option:dns-server,%s", v.Name, v.Gateway))
	}
	logf, err := os.Create(filepath.Join(b.dir, "dnsmasq", z.ID+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	waited, err := deathsig.Start(cmd, syscall.SIGKILL)
	if err != nil {
		return fmt.Errorf("testvm: dnsmasq for %s: %w", z.ID, err)
	}
	done := make(chan struct{})
	b.mu.Lock()
	zs.dnsmasq, zs.done = cmd, done
	b.mu.Unlock()
	go func() { <-waited; close(done) }()
	// Ready once it answers its local name on the first gateway.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ok := b.dnsReady(z); ok {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("testvm: dnsmasq for %s exited: %s", z.ID, strings.TrimSpace(string(log)))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testvm: dnsmasq for %s did not come up", z.ID)
		}
	}
}

func prefixMask(p netip.Prefix) string {
	bits := p.Bits()
	var m [4]byte
	for i := 0; i < bits; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(m).String()
}

// syncNAT rewrites the bed's own NAT table (ip pve-testbed) for the
// current SNAT vnets, like Proxmox SDN's SNAT rules.
func (b *Bed) syncNAT(ctx context.Context) error {
	b.mu.Lock()
	var subnets []string
	for _, zs := range b.zones {
		for _, v := range zs.zone.VNets {
			if v.SNAT {
				subnets = append(subnets, v.Subnet.String())
			}
		}
	}
	b.mu.Unlock()
	sort.Strings(subnets)
	var sb strings.Builder
	sb.WriteString("table ip pve-testbed\ndelete table ip pve-testbed\ntable ip pve-testbed {\n chain postrouting {\n  type nat hook postrouting priority srcnat; policy accept;\n")
	for _, s := range subnets {
		fmt.Fprintf(&sb, "  ip saddr %s oifname { %q, %q } masquerade\n", s, NodeMgmtIface, NodeMgmtIface2)
	}
	sb.WriteString(" }\n}\n")
	if err := runInput(ctx, sb.String(), "ip", "netns", "exec", b.NodeNS(), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("testvm: sync NAT: %w", err)
	}
	return nil
}

// RestoreNAT puts the bed's NAT table back, e.g. after a test ran
// `nft flush ruleset` in the node.
func (b *Bed) RestoreNAT(ctx context.Context) error { return b.syncNAT(ctx) }
