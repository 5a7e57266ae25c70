package testvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Addresses inside the bed. They exist only inside the bed's namespaces.
const (
	NodeMgmtIface  = "mgmt0"            // node NIC with the default route
	NodeMgmtAddr   = "192.0.2.2"        // node's management address
	NodeMgmtAddr6  = "2001:db8:1::2"    // node's management address, IPv6
	UplinkAddr     = "192.0.2.1"        // default gateway of the node
	UplinkAddr6    = "2001:db8:1::1"    // default IPv6 gateway of the node
	InternetAddr   = "203.0.113.10"     // "internet" host: HTTP 80, HTTPS 443, DNS 53
	InternetAddr6  = "2001:db8:100::10" // the same host over IPv6 (HTTP 80)
	InternetName   = "example.test"     // resolves to InternetAddr at InternetAddr:53
	InternetTXT    = "internet host"    // InternetName's TXT record
	LANAddr        = "192.168.77.10"    // "LAN" host, HTTP 80
	MetadataAddr   = "169.254.169.254"  // EC2-style metadata service, HTTP 80
	AWSDNSAddr     = "169.254.169.253"  // AWS DNS stand-in (TCP/UDP 53)
	AlibabaMDAddr  = "100.100.100.200"  // Alibaba metadata, HTTP 80
	AzureWireAddr  = "168.63.129.16"    // Azure WireServer, HTTP 80
	MetadataAddr6  = "fd00:ec2::254"    // AWS IPv6 metadata, HTTP 80
	uplinkAddr2    = "198.51.100.1"     // second uplink (SetDefaultRoute tests)
	nodeMgmtAddr2  = "198.51.100.2"     // node side of the second uplink
	NodeMgmtIface2 = "mgmt1"            // node's second uplink NIC (AddSecondUplink)
	// InstanceID is what the metadata service answers for instance-id.
	InstanceID = "i-0pveinspecttestbed"
)

// DefaultNodePorts are the control-plane stand-ins the node listens on.
var defaultNodePorts = []int{8006, 22, 3128}

// stateRoot holds one directory per bed.
const stateRoot = "/run/pve-inspect-testbed"

// Options configures a bed.
type Options struct {
	// Name prefixes every namespace and link; "" picks "pt" and 4 random hex
	// digits. At most 8 characters of [a-z0-9].
	Name string
	// Dir is the bed's state directory; "" = /run/pve-inspect-testbed/<Name>.
	Dir string
	// NodePorts replaces the default control-plane stand-ins (8006, 22,
	// 3128); use it to leave a port free for a real service (the API
	// emulator on 8006).
	NodePorts []int
	// ExtraNodePorts adds stand-ins, e.g. the daemon's metrics and API ports.
	ExtraNodePorts []int
	// Logger receives progress; nil discards.
	Logger *slog.Logger
	// ImagesDir, when set, is served by the internet host under /images/
	// (ImagesURL): the files a test offers for download, e.g. a cloud image
	// for Proxmox's download-url. Other paths answer as without it.
	ImagesDir string
}

// ImagesURL is the internet host's URL of file name in Options.ImagesDir.
func ImagesURL(name string) string { return "http://" + InternetAddr + "/images/" + name }

// Bed is a running node in a box. Close it.
type Bed struct {
	name string
	dir  string
	log  *slog.Logger

	services *services

	// zoneOps serializes adding and removing zones and restarting their
	// dnsmasqs (held across each whole operation; taken before mu).
	zoneOps sync.Mutex
	mu      sync.Mutex
	zones   map[string]*zoneState
	guests  map[int]*Guest
	// cts are the running containers (container.go), in the same VMID
	// space as guests.
	cts map[int]*Container
	// qgaReason is qemu-ga's frozen-state reason (qgaFrozenReason).
	qgaReason string
	closed    bool
	uplink2   bool
}

var (
	nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{1,7}$`)
	// linkSuffixRE matches the suffixes of the veth names a bed creates in
	// the root namespace before moving them (see buildNetwork, StartGuest).
	linkSuffixRE = regexp.MustCompile(`^([mn][01]|[gh][0-9]+)$`)
)

// Up builds a bed: the node and uplink namespaces, the uplink's services
// and the node's control-plane stand-ins. Beds left behind by a test run
// that died are swept first.
func Up(ctx context.Context, o Options) (b *Bed, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("testvm: the test bed needs root")
	}
	if o.Name == "" {
		var r [2]byte
		if _, err := rand.Read(r[:]); err != nil {
			return nil, err
		}
		o.Name = "pt" + hex.EncodeToString(r[:])
	}
	if !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("testvm: bed name %q: want 2-8 of [a-z0-9], starting with a letter", o.Name)
	}
	if o.Dir == "" {
		o.Dir = filepath.Join(stateRoot, o.Name)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := SweepStale(ctx); err != nil {
		return nil, fmt.Errorf("testvm: sweep stale beds: %w", err)
	}
	// A half-torn bed of the same name whose owner is alive is not ours.
	if owner, ok := readOwner(o.Dir); ok && owner != os.Getpid() {
		return nil, fmt.Errorf("testvm: bed %s is in use by pid %d", o.Name, owner)
	}
	if err := sweepBed(ctx, o.Name, o.Dir); err != nil {
		return nil, fmt.Errorf("testvm: clean half-torn bed %s: %w", o.Name, err)
	}
	b = &Bed{name: o.Name, dir: o.Dir, log: o.Logger.With("component", "testbed", "bed", o.Name),
		zones: map[string]*zoneState{}, guests: map[int]*Guest{}, cts: map[int]*Container{}}
	for _, d := range []string{b.dir, b.QGADir(), filepath.Join(b.dir, "guests"), filepath.Join(b.dir, "dnsmasq")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := writeOwner(b.dir); err != nil {
		return nil, err
	}
	// The error returns below set b to nil before this runs: close the bed
	// through its own variable.
	bed := b
	defer func() {
		if err != nil {
			_ = bed.Close()
			b = nil
		}
	}()
	if err := b.buildNetwork(ctx); err != nil {
		return nil, fmt.Errorf("testvm: build network: %w", err)
	}
	ports := defaultNodePorts
	if o.NodePorts != nil {
		ports = o.NodePorts
	}
	ports = append(append([]int(nil), ports...), o.ExtraNodePorts...)
	if b.services, err = startServices(b, ports, o.ImagesDir); err != nil {
		return nil, fmt.Errorf("testvm: start services: %w", err)
	}
	// The SDN resolver file the zone dnsmasqs forward through.
	if err := os.WriteFile(b.ResolvConf(), []byte("nameserver "+InternetAddr+"\n"), 0o644); err != nil {
		return nil, err
	}
	b.log.Info("bed up", "dir", b.dir)
	return b, nil
}

// Name is the bed's prefix.
func (b *Bed) Name() string { return b.name }

// Dir is the bed's state directory.
func (b *Bed) Dir() string { return b.dir }

// NodeNS is the network namespace of the node (the Proxmox host).
func (b *Bed) NodeNS() string { return b.name + "-node" }

// UplinkNS is the namespace behind the node's management NIC.
func (b *Bed) UplinkNS() string { return b.name + "-up" }

// GuestNS is the network namespace of guest vmid.
func (b *Bed) GuestNS(vmid int) string { return b.name + "-g" + strconv.Itoa(vmid) }

// QGADir holds the <vmid>.qga agent sockets, like /var/run/qemu-server.
func (b *Bed) QGADir() string { return filepath.Join(b.dir, "qemu-server") }

// ResolvConf is the SDN resolver file the zone dnsmasqs forward through,
// like /run/dnsmasq/resolv.conf on a node.
func (b *Bed) ResolvConf() string { return filepath.Join(b.dir, "dnsmasq", "resolv.conf") }

// Close tears the bed down: guests, zones, services, namespaces and the
// state directory. It is idempotent.
func (b *Bed) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	if b.services != nil {
		b.services.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := sweepBed(ctx, b.name, b.dir)
	b.log.Info("bed down", "err", err)
	return err
}

func (b *Bed) buildNetwork(ctx context.Context) error {
	node, up := b.NodeNS(), b.UplinkNS()
	steps := [][]string{
		{"ip", "netns", "add", node},
		{"ip", "netns", "add", up},
		{"ip", "link", "add", b.name + "m0", "type", "veth", "peer", "name", b.name + "m1"},
		{"ip", "link", "set", b.name + "m0", "netns", node},
		{"ip", "link", "set", b.name + "m1", "netns", up},
		{"ip", "-n", node, "link", "set", b.name + "m0", "name", NodeMgmtIface},
		{"ip", "-n", up, "link", "set", b.name + "m1", "name", "up0"},
		{"ip", "-n", node, "link", "set", "lo", "up"},
		{"ip", "-n", up, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0"},
		{"ip", "netns", "exec", up, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0", "net.ipv4.ip_forward=1"},
		{"ip", "-n", node, "addr", "add", NodeMgmtAddr + "/24", "dev", NodeMgmtIface},
		{"ip", "-n", node, "addr", "add", NodeMgmtAddr6 + "/64", "dev", NodeMgmtIface, "nodad"},
		{"ip", "-n", up, "addr", "add", UplinkAddr + "/24", "dev", "up0"},
		{"ip", "-n", up, "addr", "add", UplinkAddr6 + "/64", "dev", "up0", "nodad"},
		{"ip", "-n", node, "link", "set", NodeMgmtIface, "up"},
		{"ip", "-n", up, "link", "set", "up0", "up"},
		{"ip", "-n", node, "route", "add", "default", "via", UplinkAddr, "dev", NodeMgmtIface},
		{"ip", "-n", node, "-6", "route", "add", "default", "via", UplinkAddr6, "dev", NodeMgmtIface},
		// Guests' IPv6 (ULA, routed, not NATed) comes back through the node.
		{"ip", "-n", up, "-6", "route", "add", "fd42::/16", "via", NodeMgmtAddr6},
	}
	for _, a := range []string{MetadataAddr, AWSDNSAddr, AlibabaMDAddr, AzureWireAddr, InternetAddr, LANAddr} {
		steps = append(steps, []string{"ip", "-n", up, "addr", "add", a + "/32", "dev", "lo"})
	}
	for _, a := range []string{MetadataAddr6, InternetAddr6} {
		steps = append(steps, []string{"ip", "-n", up, "addr", "add", a + "/128", "dev", "lo", "nodad"})
	}
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			return err
		}
	}
	return b.syncNAT(ctx)
}

// AddSecondUplink gives the node a second uplink NIC (NodeMgmtIface2,
// 198.51.100.2/24) without a default route.
func (b *Bed) AddSecondUplink(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.uplink2 {
		return nil
	}
	node, up := b.NodeNS(), b.UplinkNS()
	for _, s := range [][]string{
		{"ip", "link", "add", b.name + "n0", "type", "veth", "peer", "name", b.name + "n1"},
		{"ip", "link", "set", b.name + "n0", "netns", node},
		{"ip", "link", "set", b.name + "n1", "netns", up},
		{"ip", "-n", node, "link", "set", b.name + "n0", "name", NodeMgmtIface2},
		{"ip", "-n", up, "link", "set", b.name + "n1", "name", "up1"},
		{"ip", "-n", node, "addr", "add", nodeMgmtAddr2 + "/24", "dev", NodeMgmtIface2},
		{"ip", "-n", up, "addr", "add", uplinkAddr2 + "/24", "dev", "up1"},
		{"ip", "-n", node, "link", "set", NodeMgmtIface2, "up"},
		{"ip", "-n", up, "link", "set", "up1", "up"},
	} {
		if err := run(ctx, s...); err != nil {
			return fmt.Errorf("testvm: second uplink: %w", err)
		}
	}
	b.uplink2 = true
	return nil
}

// SetDefaultRoute points the node's IPv4 default route out of iface
// (NodeMgmtIface or NodeMgmtIface2); "" removes the IPv4 and IPv6 default
// routes altogether.
func (b *Bed) SetDefaultRoute(ctx context.Context, iface string) error {
	node := b.NodeNS()
	_ = run(ctx, "ip", "-n", node, "route", "del", "default")
	if iface == "" {
		_ = run(ctx, "ip", "-n", node, "-6", "route", "del", "default")
		return nil
	}
	gw := map[string]string{NodeMgmtIface: UplinkAddr, NodeMgmtIface2: uplinkAddr2}[iface]
	if gw == "" {
		return fmt.Errorf("testvm: unknown uplink %q", iface)
	}
	if err := run(ctx, "ip", "-n", node, "route", "replace", "default", "via", gw, "dev", iface); err != nil {
		return fmt.Errorf("testvm: set default route: %w", err)
	}
	if iface == NodeMgmtIface {
		_ = run(ctx, "ip", "-n", node, "-6", "route", "replace", "default", "via", UplinkAddr6, "dev", iface)
	}
	return nil
}

// --- ownership and sweeping -------------------------------------------------

func writeOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())+" "+procStart(os.Getpid())+"\n"), 0o644)
}

// readOwner returns the pid recorded as the bed's owner, if that process is
// still the same one (same start time).
func readOwner(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "owner"))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, false
	}
	if procStart(pid) != f[1] || procZombie(pid) {
		return pid, false
	}
	return pid, true
}

// procZombie reports whether pid has exited but not been reaped: its stat
// and start time stay, yet it owns nothing any more.
func procZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return true
	}
	return s[i+2] == 'Z' || s[i+2] == 'X'
}

// procStart is the start time of pid in clock ticks (field 22 of stat), or "".
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// SweepStale removes every bed whose owning process is gone (a test run
// that was killed). Beds of live processes are left alone.
func SweepStale(ctx context.Context) error {
	ents, err := os.ReadDir(stateRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !nameRE.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(stateRoot, e.Name())
		if _, alive := readOwner(dir); alive {
			continue
		}
		if err := sweepBed(ctx, e.Name(), dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := sweepOrphanCgroups("/run/netns", "*"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sweepBed kills every process inside the bed's namespaces, deletes the
// namespaces (and with them every link and bridge) and the state directory.
func sweepBed(ctx context.Context, name, dir string) error {
	out, _ := output(ctx, "ip", "netns", "list")
	var nss []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], name+"-") {
			nss = append(nss, f[0])
		}
	}
	var errs []error
	// Guests first: killing a guest's init kills its whole PID namespace.
	for round := 0; round < 50; round++ {
		left := 0
		for _, ns := range nss {
			pids, _ := output(ctx, "ip", "netns", "pids", ns)
			for _, p := range strings.Fields(string(pids)) {
				if pid, err := strconv.Atoi(p); err == nil && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					left++
				}
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, ns := range nss {
		if err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Veths still in the root namespace if a build died midway.
	for _, l := range rootLinksWithPrefix(name) {
		_ = run(ctx, "ip", "link", "del", l)
	}
	if err := sweepCgroups(name); err != nil {
		errs = append(errs, err)
	}
	if dir != "" {
		unmountNodeSys(dir)
		if err := unmountCgroupBind(dir); err != nil {
			return errors.Join(append(errs, err)...)
		}
		freeLoops(ctx, dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func rootLinksWithPrefix(prefix string) []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, prefix) && linkSuffixRE.MatchString(i.Name[len(prefix):]) {
			out = append(out, i.Name)
		}
	}
	return out
}
