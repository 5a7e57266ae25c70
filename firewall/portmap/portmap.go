package portmap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// MaxFileSize bounds every file read (VM configs, leases, ethers).
const MaxFileSize = 4 << 20

// maxLine bounds one line of a parsed file.
const maxLine = 4096

// NIC is one network device of a VM configuration (netN).
type NIC struct {
	Index    int
	Model    string
	MAC      net.HardwareAddr
	Bridge   string
	Firewall bool
}

// nicModels are qemu-server's NIC models (PVE/QemuServer/Network.pm,
// $nic_model_list); "<model>=<MAC>" is the short form of model and macaddr.
var nicModels = []string{"e1000", "e1000-82540em", "e1000-82544gc", "e1000-82545em", "e1000e",
	"i82551", "i82557b", "i82559er", "ne2k_isa", "ne2k_pci", "pcnet", "rtl8139", "virtio", "vmxnet3"}

var (
	netKeyRE = regexp.MustCompile(`^net([0-9]|[1-9][0-9]|[12][0-9]{2}|3[01][0-9])$`)
	macRE    = regexp.MustCompile(`^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$`)
	bridgeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,14}$`)
)

// ParseNet parses the value of config key netN ("virtio=BC:24:11:..,
// bridge=vnet1,firewall=1"). Unknown properties are ignored; a NIC
// without a MAC is an error (the guard cannot pin it).
func ParseNet(key, value string) (NIC, error) {
	return parseNIC(key, value, func(n *NIC, k, v string) error {
		switch {
		case slices.Contains(nicModels, k) || k == "macaddr":
			if slices.Contains(nicModels, k) {
				if n.Model != "" {
					return errors.New("two models")
				}
				n.Model = k
			}
			if n.MAC != nil {
				return errors.New("two MAC addresses")
			}
			mac, err := parseMAC(v)
			if err != nil {
				return err
			}
			n.MAC = mac
		case k == "model":
			if !slices.Contains(nicModels, v) || n.Model != "" {
				return fmt.Errorf("bad model %q", v)
			}
			n.Model = v
		}
		return nil
	}, func(n *NIC, part string) bool {
		if slices.Contains(nicModels, part) && n.Model == "" {
			n.Model = part // model without a MAC
			return true
		}
		return false
	})
}

// parseNIC parses a guest config's netN key and its value, a property
// string of comma-separated parts: bridge and firewall, which both kinds
// of guest have, here; every other key=value goes to prop, every part
// without '=' to bare (false, or bare nil: an error). A key given twice,
// or a NIC without a MAC, is an error.
func parseNIC(key, value string, prop func(n *NIC, k, v string) error, bare func(n *NIC, part string) bool) (NIC, error) {
	m := netKeyRE.FindStringSubmatch(key)
	if m == nil {
		return NIC{}, fmt.Errorf("%q is not a netN key", key)
	}
	idx, _ := strconv.Atoi(m[1])
	n := NIC{Index: idx}
	if len(value) > maxLine {
		return NIC{}, fmt.Errorf("%s: value too long", key)
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(value, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			if bare != nil && bare(&n, part) {
				continue
			}
			return NIC{}, fmt.Errorf("%s: property %q has no value", key, part)
		}
		if seen[k] {
			return NIC{}, fmt.Errorf("%s: property %s given twice", key, k)
		}
		seen[k] = true
		var err error
		switch k {
		case "bridge":
			if !bridgeRE.MatchString(v) {
				err = fmt.Errorf("bad bridge %q", v)
			}
			n.Bridge = v
		case "firewall":
			switch v {
			case "0":
			case "1":
				n.Firewall = true
			default:
				err = fmt.Errorf("bad firewall %q", v)
			}
		default:
			err = prop(&n, k, v)
		}
		if err != nil {
			return NIC{}, fmt.Errorf("%s: %w", key, err)
		}
	}
	if n.MAC == nil {
		return NIC{}, fmt.Errorf("%s: no MAC address", key)
	}
	return n, nil
}

// parseMAC accepts a unicast Ethernet address written XX:XX:XX:XX:XX:XX.
func parseMAC(s string) (net.HardwareAddr, error) {
	if !macRE.MatchString(s) {
		return nil, fmt.Errorf("bad MAC %q", s)
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make([]byte, 6)) {
		return nil, fmt.Errorf("bad MAC %q: not a unicast Ethernet address", s)
	}
	return mac, nil
}

// ParseConfig returns the NICs of a VM configuration file (the current
// section only: parsing stops at the first snapshot or pending section)
// and the problems of lines it skipped.
func ParseConfig(r io.Reader) ([]NIC, []string, error) {
	return parseConfig(r, ParseNet)
}

// ParseCTConfig is ParseConfig for a container's configuration
// (etc/pve/lxc/<vmid>.conf), whose NICs are in pve-container's net format
// (ParseCTNet).
func ParseCTConfig(r io.Reader) ([]NIC, []string, error) {
	return parseConfig(r, ParseCTNet)
}

// parseConfig returns the NICs of a guest configuration, each netN line
// parsed by parse.
func parseConfig(r io.Reader, parse func(key, value string) (NIC, error)) ([]NIC, []string, error) {
	var nics []NIC
	var problems []string
	err := eachLine(r, func(no int, line string) bool {
		if strings.HasPrefix(line, "[") {
			return false
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(k, "net") {
			return true
		}
		n, err := parse(k, strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", no, err))
			return true
		}
		nics = append(nics, n)
		return true
	})
	return nics, problems, err
}

// Lease is one IPv4 a zone's DHCP server gave (or reserved for) a MAC.
type Lease struct {
	MAC net.HardwareAddr
	IP  netip.Addr
	// Expiry is zero for a static mapping or an infinite lease.
	Expiry time.Time
}

// ParseLeases parses a dnsmasq lease file: "<expiry> <MAC> <IP> <host>
// <client-id>" per line, expiry in Unix seconds (0: infinite). IPv6
// lines ("duid ..." and what follows) are skipped.
func ParseLeases(r io.Reader) ([]Lease, []string, error) {
	var out []Lease
	var problems []string
	err := eachLine(r, func(no int, line string) bool {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "duid" {
			return false // the IPv6 part
		}
		if len(f) < 3 {
			problems = append(problems, fmt.Sprintf("line %d: too few fields", no))
			return true
		}
		exp, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || exp < 0 {
			problems = append(problems, fmt.Sprintf("line %d: bad expiry %q", no, f[0]))
			return true
		}
		mac, err := parseMAC(f[1])
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", no, err))
			return true
		}
		ip, err := parseIPv4(f[2])
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", no, err))
			return true
		}
		l := Lease{MAC: mac, IP: ip}
		if exp > 0 {
			l.Expiry = time.Unix(exp, 0)
		}
		out = append(out, l)
		return true
	})
	return out, problems, err
}

// ParseEthers parses pve-network's static mappings of a zone (dnsmasq
// dhcp-hostsfile): "MAC,IPv4", "MAC,IPv4,[IPv6]" or "MAC,[IPv6]".
func ParseEthers(r io.Reader) ([]Lease, []string, error) {
	var out []Lease
	var problems []string
	err := eachLine(r, func(no int, line string) bool {
		f := strings.Split(line, ",")
		mac, err := parseMAC(f[0])
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", no, err))
			return true
		}
		if len(f) < 2 || len(f) > 3 || strings.HasPrefix(f[1], "[") {
			return true // no IPv4 in this mapping
		}
		ip, err := parseIPv4(f[1])
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", no, err))
			return true
		}
		out = append(out, Lease{MAC: mac, IP: ip})
		return true
	})
	return out, problems, err
}

func parseIPv4(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() || a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return netip.Addr{}, fmt.Errorf("bad IPv4 address %q", s)
	}
	return a, nil
}

// eachLine calls fn with every non-empty, non-comment line (trimmed) until
// fn returns false. Lines longer than maxLine are an error.
func eachLine(r io.Reader, fn func(no int, line string) bool) error {
	sc := bufio.NewScanner(io.LimitReader(r, MaxFileSize))
	sc.Buffer(make([]byte, 0, 1024), maxLine)
	no := 0
	for sc.Scan() {
		no++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !fn(no, line) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("line %d: %w", no+1, err)
	}
	return nil
}

// VM is one VM of the node with its NICs.
type VM struct {
	VMID int
	NICs []NIC
	// Container: the guest is a container (its NICs are veths, named by
	// firewall.ContainerPortNames), not a QEMU VM.
	Container bool
}

// Ports maps every NIC of vms to its bridge ports, with the addresses the
// leases (unexpired at now) and static mappings give its MAC. bridges,
// when not nil, limits the map to NICs on those bridges.
func Ports(vms []VM, leases []Lease, now time.Time, bridges []string) []firewall.Port {
	byMAC := map[string][]netip.Addr{}
	for _, l := range leases {
		if !l.Expiry.IsZero() && !l.Expiry.After(now) {
			continue
		}
		k := l.MAC.String()
		if !slices.Contains(byMAC[k], l.IP) {
			byMAC[k] = append(byMAC[k], l.IP)
		}
	}
	var out []firewall.Port
	for _, vm := range vms {
		for _, n := range vm.NICs {
			if bridges != nil && !slices.Contains(bridges, n.Bridge) {
				continue
			}
			names := firewall.GuestPortNames(vm.Container, vm.VMID, n.Index)
			if !n.Firewall {
				names = names[:1]
			}
			for _, name := range names {
				out = append(out, firewall.Port{Name: name, MAC: slices.Clone(n.MAC), IPv4: slices.Clone(byMAC[n.MAC.String()])})
			}
		}
	}
	return out
}

// Paths are where a node keeps the files; Root prefixes all of them
// ("" is /).
type Paths struct {
	Root string
}

func (p Paths) path(elem ...string) string {
	return filepath.Join(append([]string{p.Root, "/"}, elem...)...)
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileSize)
	}
	return b, nil
}

// ErrNoVMConfigs is ReadVMs' error when the node has no guest
// configuration directory (yet), neither for VMs nor for containers: the
// node in a box before its first guest, or /etc/pve while pmxcfs is not
// mounted. The caller keeps its last map and reads again later; it is not
// a failure to report.
var ErrNoVMConfigs = errors.New("no VM configuration directory")

var confNameRE = regexp.MustCompile(`^([1-9][0-9]{2,8})\.conf$`)

// ReadVMs reads the NICs of every guest configuration of the node: the
// VMs' (etc/pve/qemu-server/<vmid>.conf, qemu-server's net format) and
// the containers' (etc/pve/lxc/<vmid>.conf, pve-container's), with the
// problems of skipped lines. One missing directory is no guests of that
// kind; both missing is ErrNoVMConfigs.
func (p Paths) ReadVMs() ([]VM, []string, error) {
	var vms []VM
	var problems []string
	missing := 0
	for _, kind := range []struct {
		dir       string
		container bool
	}{{"qemu-server", false}, {"lxc", true}} {
		got, pr, err := p.readGuests(kind.dir, kind.container)
		if errors.Is(err, fs.ErrNotExist) {
			missing++
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		vms, problems = append(vms, got...), append(problems, pr...)
	}
	if missing == 2 {
		return nil, nil, fmt.Errorf("read VM configs: %w: no %s or %s", ErrNoVMConfigs, p.path("etc", "pve", "qemu-server"), p.path("etc", "pve", "lxc"))
	}
	return vms, problems, nil
}

// readGuests reads the configurations in etc/pve/<dir>, of containers
// when container is set.
func (p Paths) readGuests(dir string, container bool) ([]VM, []string, error) {
	dir = p.path("etc", "pve", dir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read guest configs: %w", err)
	}
	parse := ParseConfig
	if container {
		parse = ParseCTConfig
	}
	var vms []VM
	var problems []string
	for _, e := range ents {
		m := confNameRE.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		vmid, _ := strconv.Atoi(m[1])
		b, err := readBounded(filepath.Join(dir, e.Name()))
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		nics, pr, err := parse(bytes.NewReader(b))
		name := filepath.Base(dir) + "/" + e.Name()
		for _, s := range pr {
			problems = append(problems, name+": "+s)
		}
		if err != nil {
			problems = append(problems, name+": "+err.Error())
			continue
		}
		vms = append(vms, VM{VMID: vmid, NICs: nics, Container: container})
	}
	return vms, problems, nil
}

var zoneRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// ReadZone reads a zone's static mappings and leases; missing files are
// no addresses, not an error.
func (p Paths) ReadZone(zone string) ([]Lease, []string, error) {
	if !zoneRE.MatchString(zone) {
		return nil, nil, fmt.Errorf("bad zone id %q", zone)
	}
	var out []Lease
	var problems []string
	for _, f := range []struct {
		path  string
		parse func(io.Reader) ([]Lease, []string, error)
	}{
		{p.path("etc", "dnsmasq.d", zone, "ethers"), ParseEthers},
		{p.path("var", "lib", "misc", "dnsmasq."+zone+".leases"), ParseLeases},
	} {
		b, err := readBounded(f.path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read zone %s: %w", zone, err)
		}
		ls, pr, err := f.parse(bytes.NewReader(b))
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", f.path, err)
		}
		for _, s := range pr {
			problems = append(problems, f.path+": "+s)
		}
		out = append(out, ls...)
	}
	return out, problems, nil
}
