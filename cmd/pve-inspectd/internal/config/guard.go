package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GuardSection is [guard]: the host guard (DESIGN.md section 3).
//
//	[guard]
//	# Extra IPv4 prefixes added to the built-in metadata set
//	# (169.254.0.0/16, 100.100.100.200/32, 168.63.129.16/32).
//	metadata4 = ["192.0.0.192/32"]
//	# Extra IPv6 prefixes added to the built-in metadata set
//	# (fd00:ec2::254/128, fe80::a9fe:a9fe/128).
//	metadata6 = []
//	# IPv4 prefixes guests may reach through the uplink although they are
//	# private (RFC 1918, 100.64.0.0/10, 198.18.0.0/15 and the like).
//	private4_allow = []
//	# Interfaces exempt from the guest input policy (cluster, storage).
//	# An interface without a default route counts as guest side: list the
//	# management NIC here too if SSH on it must survive losing the default
//	# route (otherwise it is cut to DHCP and DNS until the route is back).
//	trusted_interfaces = ["vmbr1"]
//	# SDN zones: zone id = its vnet bridges. Bridges of one zone may
//	# forward to each other; every other pair of non-uplink interfaces
//	# is isolated (unknown bridges included).
//	zones = { zone1 = ["vnet1", "vnet2"] }
//	# Proxmox's applied SDN config: the vnets of each zone in it may
//	# forward to each other too (merged with zones above and the zones
//	# the sandbox API creates). Polled every few seconds; "" turns it off.
//	sdn_config = "/etc/pve/sdn/.running-config"
//	# Converge the Proxmox management-port firewall rules (tcp 8006 and 22
//	# on the default-route NIC, udp/tcp 53 and udp 67, node and cluster
//	# firewall on) through the Proxmox API with the daemon's token
//	# ([api.proxmox]), whether or not the sandbox API is enabled; every
//	# mgmt_interval and when the default route moves.
//	mgmt_rules = true
//	mgmt_interval = "1m"
//	# User (name or uid) the SDN dnsmasq runs as; its upstream traffic is
//	# cut during the lockdown. A missing user leaves that rule out (plan says so).
//	dnsmasq_user = "dnsmasq"
//	# How often the kernel table is compared with the desired one.
//	verify_interval = "30s"
//	# Where /proc is mounted (net.ipv6.conf.default.disable_ipv6 is set there).
//	proc_root = "/proc"
//	# Where the guard keeps the sysctl value `guard remove` restores.
//	state_dir = "/run/pve-inspectd"
//	# Root under which the layer-2 guard reads the VM configs
//	# (etc/pve/qemu-server) and the zones' DHCP mappings and leases
//	# (etc/dnsmasq.d, var/lib/misc) to pin each guest port to its MAC
//	# and IPv4.
//	node_root = "/"
//	# Guest floods (many flows, SYN floods, packet floods, ARP storms)
//	# must not take the control plane down. TCP ports of the node not
//	# tracked by conntrack on the management interfaces and on lo (both
//	# directions): a conntrack table guests filled cannot refuse them.
//	# The ports of [api] listen and [metrics] listen are always added.
//	management_ports = [22, 8006]
//	# Tracked connections one guest interface (a zone bridge, all its
//	# guests) may hold; its new connections beyond are dropped. Left out:
//	# node_conn_limit / [egress] owners (2048 at the defaults), so every
//	# zone at its limit still fits node_conn_limit; set, conn_limit x
//	# [egress] owners must not pass node_conn_limit. A sandbox with
//	# several networks has one limit per network bridge.
//	conn_limit = 2048
//	# Tracked connections all guest interfaces together may hold; keep it
//	# well under the node's nf_conntrack_max (262144 under pve-firewall).
//	node_conn_limit = 131072
//	# DNS packets (udp and tcp to port 53) a second (and burst) one guest
//	# interface may send to the node's resolvers.
//	dns_rate = 500
//	dns_burst = 1000
//	# Packets a second (and burst) one guest interface may send to or
//	# through the node; the rest are dropped before conntrack sees them.
//	# Virtio NICs hand over GRO-merged packets: bulk transfers stay below.
//	packet_rate = 50000
//	packet_burst = 10000
//	# ARP frames and broadcast/multicast frames a second (and burst) one
//	# guest port (tap) may send, policed in table bridge pve-inspect.
//	port_arp_rate = 100
//	port_arp_burst = 200
//	port_broadcast_rate = 200
//	port_broadcast_burst = 400
type GuardSection struct {
	Metadata4      []string            `toml:"metadata4"`
	Metadata6      []string            `toml:"metadata6"`
	Private4Allow  []string            `toml:"private4_allow"`
	Trusted        []string            `toml:"trusted_interfaces"`
	Zones          map[string][]string `toml:"zones"`
	SDNConfig      string              `toml:"sdn_config"`
	MgmtRules      bool                `toml:"mgmt_rules"`
	MgmtInterval   string              `toml:"mgmt_interval"`
	DnsmasqUser    string              `toml:"dnsmasq_user"`
	VerifyInterval string              `toml:"verify_interval"`
	ProcRoot       string              `toml:"proc_root"`
	StateDir       string              `toml:"state_dir"`
	NodeRoot       string              `toml:"node_root"`

	ManagementPorts    []int `toml:"management_ports"`
	ConnLimit          int   `toml:"conn_limit"`
	NodeConnLimit      int   `toml:"node_conn_limit"`
	DNSRate            int   `toml:"dns_rate"`
	DNSBurst           int   `toml:"dns_burst"`
	PacketRate         int   `toml:"packet_rate"`
	PacketBurst        int   `toml:"packet_burst"`
	PortARPRate        int   `toml:"port_arp_rate"`
	PortARPBurst       int   `toml:"port_arp_burst"`
	PortBroadcastRate  int   `toml:"port_broadcast_rate"`
	PortBroadcastBurst int   `toml:"port_broadcast_burst"`
}

// MetricsSection is [metrics]: the Prometheus listener.
//
//	[metrics]
//	# host:port of the /metrics listener; keep it on loopback or a
//	# management address, never a guest-facing one. "" disables it.
//	listen = "127.0.0.1:9474"
type MetricsSection struct {
	Listen string `toml:"listen"`
}

// connLimitUnset marks [guard] conn_limit left out of the file while
// parsing: it is then derived (Config.derivedConnLimit).
const connLimitUnset = math.MinInt

func defaultGuard() GuardSection {
	return GuardSection{DnsmasqUser: "dnsmasq", SDNConfig: "/etc/pve/sdn/.running-config", MgmtRules: true, MgmtInterval: "1m", VerifyInterval: "30s", ProcRoot: "/proc", StateDir: "/run/pve-inspectd", NodeRoot: "/",
		ManagementPorts: []int{22, 8006}, NodeConnLimit: 131072, DNSRate: 500, DNSBurst: 1000, PacketRate: 50000, PacketBurst: 10000,
		PortARPRate: 100, PortARPBurst: 200, PortBroadcastRate: 200, PortBroadcastBurst: 400}
}

// addListenerPorts adds the ports of the daemon's own listeners (host:port;
// an unparsable or empty one is left to its section's validation) to
// management_ports.
func (s *GuardSection) addListenerPorts(listen ...string) {
	for _, l := range listen {
		_, p, err := net.SplitHostPort(l)
		if err != nil {
			continue
		}
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 || slices.Contains(s.ManagementPorts, int(n)) {
			continue
		}
		s.ManagementPorts = append(s.ManagementPorts, int(n))
	}
}

func defaultMetrics() MetricsSection { return MetricsSection{Listen: "127.0.0.1:9474"} }

func parsePrefixes(key string, in []string, want4 bool) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for i, s := range in {
		k := fmt.Sprintf("%s[%d]", key, i)
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			a, aerr := netip.ParseAddr(strings.TrimSpace(s))
			if aerr != nil {
				return nil, &KeyError{Key: k, Err: fmt.Errorf("%q is not a prefix or address", s)}
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Zone() != "" {
			return nil, &KeyError{Key: k, Err: fmt.Errorf("%q has a zone", s)}
		}
		if want4 && !p.Addr().Is4() {
			return nil, &KeyError{Key: k, Err: fmt.Errorf("%q is not IPv4", s)}
		}
		if !want4 && (!p.Addr().Is6() || p.Addr().Is4In6()) {
			return nil, &KeyError{Key: k, Err: fmt.Errorf("%q is not IPv6", s)}
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func checkIfname(key, n string) error {
	if n == "" || len(n) > 15 || n == "." || n == ".." || strings.ContainsAny(n, "/: \t\n\x00") {
		return &KeyError{Key: key, Err: fmt.Errorf("%q is not an interface name (1-15 characters, no '/', ':' or space)", n)}
	}
	return nil
}

// Metadata4Prefixes returns metadata4 parsed (valid after Validate).
func (s GuardSection) Metadata4Prefixes() []netip.Prefix {
	p, _ := parsePrefixes("guard.metadata4", s.Metadata4, true)
	return p
}

// Metadata6Prefixes returns metadata6 parsed (valid after Validate).
func (s GuardSection) Metadata6Prefixes() []netip.Prefix {
	p, _ := parsePrefixes("guard.metadata6", s.Metadata6, false)
	return p
}

// Private4AllowPrefixes returns private4_allow parsed (valid after Validate).
func (s GuardSection) Private4AllowPrefixes() []netip.Prefix {
	p, _ := parsePrefixes("guard.private4_allow", s.Private4Allow, true)
	return p
}

// MgmtEvery returns mgmt_interval parsed (valid after Validate).
func (s GuardSection) MgmtEvery() time.Duration {
	d, _ := time.ParseDuration(s.MgmtInterval)
	return d
}

// VerifyEvery returns verify_interval parsed (valid after Validate).
func (s GuardSection) VerifyEvery() time.Duration {
	d, _ := time.ParseDuration(s.VerifyInterval)
	return d
}

func (s GuardSection) validate(prefix string) error {
	if _, err := parsePrefixes(prefix+".metadata4", s.Metadata4, true); err != nil {
		return err
	}
	if _, err := parsePrefixes(prefix+".metadata6", s.Metadata6, false); err != nil {
		return err
	}
	if _, err := parsePrefixes(prefix+".private4_allow", s.Private4Allow, true); err != nil {
		return err
	}
	for i, n := range s.Trusted {
		if err := checkIfname(fmt.Sprintf("%s.trusted_interfaces[%d]", prefix, i), n); err != nil {
			return err
		}
	}
	for zone, bridges := range s.Zones {
		if zone == "" {
			return &KeyError{Key: prefix + ".zones", Err: errors.New("empty zone id")}
		}
		for i, b := range bridges {
			if err := checkIfname(fmt.Sprintf("%s.zones.%s[%d]", prefix, zone, i), b); err != nil {
				return err
			}
		}
	}
	if s.SDNConfig != "" && (!filepath.IsAbs(s.SDNConfig) || strings.ContainsRune(s.SDNConfig, 0)) {
		return &KeyError{Key: prefix + ".sdn_config", Err: fmt.Errorf("%q is not an absolute path (or \"\" to turn it off)", s.SDNConfig)}
	}
	if s.DnsmasqUser == "" || strings.ContainsAny(s.DnsmasqUser, ": \t\n\x00") {
		return &KeyError{Key: prefix + ".dnsmasq_user", Err: fmt.Errorf("%q is not a user name or uid", s.DnsmasqUser)}
	}
	d, err := time.ParseDuration(s.VerifyInterval)
	if err != nil {
		return &KeyError{Key: prefix + ".verify_interval", Err: fmt.Errorf("%q is not a duration like \"30s\"", s.VerifyInterval)}
	}
	if d < time.Second || d > 24*time.Hour {
		return &KeyError{Key: prefix + ".verify_interval", Err: fmt.Errorf("%s is outside 1s..24h", d)}
	}
	if d, err := time.ParseDuration(s.MgmtInterval); err != nil || d < time.Second || d > 24*time.Hour {
		return &KeyError{Key: prefix + ".mgmt_interval", Err: fmt.Errorf("%q is not a duration in 1s..24h like \"1m\"", s.MgmtInterval)}
	}
	for i, p := range s.ManagementPorts {
		if p < 1 || p > 65535 {
			return &KeyError{Key: fmt.Sprintf("%s.management_ports[%d]", prefix, i), Err: fmt.Errorf("%d is not a port 1-65535", p)}
		}
	}
	for key, v := range map[string]int{".conn_limit": s.ConnLimit, ".node_conn_limit": s.NodeConnLimit, ".dns_rate": s.DNSRate, ".dns_burst": s.DNSBurst, ".packet_rate": s.PacketRate, ".packet_burst": s.PacketBurst,
		".port_arp_rate": s.PortARPRate, ".port_arp_burst": s.PortARPBurst, ".port_broadcast_rate": s.PortBroadcastRate, ".port_broadcast_burst": s.PortBroadcastBurst} {
		if v < 1 || v > 1<<24 {
			return &KeyError{Key: prefix + key, Err: fmt.Errorf("%d is outside 1..%d", v, 1<<24)}
		}
	}
	for key, p := range map[string]string{".proc_root": s.ProcRoot, ".state_dir": s.StateDir, ".node_root": s.NodeRoot} {
		if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
			return &KeyError{Key: prefix + key, Err: fmt.Errorf("%q is not an absolute path", p)}
		}
	}
	return nil
}

func (s MetricsSection) validate(prefix string) error {
	if s.Listen == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(s.Listen)
	if err != nil {
		return &KeyError{Key: prefix + ".listen", Err: fmt.Errorf("%q is not host:port", s.Listen)}
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return &KeyError{Key: prefix + ".listen", Err: fmt.Errorf("port %q is not 1-65535", port)}
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil && host != "localhost" {
			return &KeyError{Key: prefix + ".listen", Err: fmt.Errorf("host %q is not an IP address", host)}
		}
	}
	return nil
}
