package pveemu

import (
	"bufio"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Firewall formats, after pve-firewall's PVE::Firewall verifiers. Protocol
// and service names come from the host's /etc/protocols and /etc/services
// like on a node, with a small built-in set when those files are absent.

var (
	reFWAlias   = regexp.MustCompile(`^(dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+$`)
	reFWIPSet   = regexp.MustCompile(`^\+\S+$`)
	reFWRange   = regexp.MustCompile(`^([0-9]+):([0-9]+)$`)
	reFWNumber  = regexp.MustCompile(`^[0-9]+$`)
	etcOnce     sync.Once
	etcProtos   map[string]bool
	etcServices map[string]bool
)

func loadEtc() {
	etcProtos = map[string]bool{"icmp": true, "1": true, "tcp": true, "6": true, "udp": true, "17": true, "ipv6-icmp": true, "icmpv6": true, "58": true, "gre": true, "47": true, "esp": true, "50": true, "ah": true, "51": true, "sctp": true, "132": true}
	etcServices = map[string]bool{"ssh": true, "http": true, "https": true, "domain": true, "bootps": true, "bootpc": true, "ntp": true}
	read := func(path string, fn func(fields []string)) {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line, _, _ := strings.Cut(sc.Text(), "#")
			if fields := strings.Fields(line); len(fields) >= 2 {
				fn(fields)
			}
		}
	}
	read("/etc/protocols", func(f []string) {
		etcProtos[f[0]] = true
		etcProtos[f[1]] = true
	})
	read("/etc/services", func(f []string) {
		etcServices[f[0]] = true
		for _, alias := range f[2:] {
			etcServices[alias] = true
		}
	})
}

var icmpTypeNames = map[string]bool{"any": true, "echo-reply": true, "destination-unreachable": true, "network-unreachable": true, "host-unreachable": true,
	"protocol-unreachable": true, "port-unreachable": true, "fragmentation-needed": true, "source-route-failed": true, "network-unknown": true,
	"host-unknown": true, "network-prohibited": true, "host-prohibited": true, "TOS-network-unreachable": true, "TOS-host-unreachable": true,
	"communication-prohibited": true, "host-precedence-violation": true, "precedence-cutoff": true, "source-quench": true, "redirect": true,
	"network-redirect": true, "host-redirect": true, "TOS-network-redirect": true, "TOS-host-redirect": true, "echo-request": true,
	"router-advertisement": true, "router-solicitation": true, "time-exceeded": true, "ttl-zero-during-transit": true,
	"ttl-zero-during-reassembly": true, "parameter-problem": true, "ip-header-bad": true, "required-option-missing": true,
	"timestamp-request": true, "timestamp-reply": true, "address-mask-request": true, "address-mask-reply": true,
	"no-route": true, "beyond-scope": true, "address-unreachable": true, "packet-too-big": true, "bad-header": true,
	"unknown-header-type": true, "unknown-option": true, "neighbor-solicitation": true, "neighbour-solicitation": true,
	"neighbor-advertisement": true, "neighbour-advertisement": true}

func init() {
	namedFormats["pve-fw-protocol-spec"] = func(v string) error {
		etcOnce.Do(loadEtc)
		if v != "" && v != "0" && !etcProtos[v] {
			return formatErr("unknown protocol '%s'", v)
		}
		return nil
	}
	namedFormats["pve-fw-sport-spec"] = func(v string) error { return fwPorts(v, false) }
	namedFormats["pve-fw-dport-spec"] = func(v string) error { return fwPorts(v, true) }
	namedFormats["pve-fw-addr-spec"] = fwAddrs
}

func fwPorts(v string, dport bool) error {
	etcOnce.Do(loadEtc)
	elems := strings.Split(v, ",")
	if strings.Join(nonEmpty(elems), ",") != v {
		return formatErr("extraneous commas in list")
	}
	count, icmp := 0, false
	for _, item := range elems {
		switch {
		case reFWRange.MatchString(item):
			m := reFWRange.FindStringSubmatch(item)
			count += 2
			a, _ := strconv.Atoi(m[1])
			b, _ := strconv.Atoi(m[2])
			if a > 65535 {
				return formatErr("invalid port '%s'", m[1])
			}
			if b > 65535 {
				return formatErr("invalid port '%s'", m[2])
			}
			if a > b {
				return formatErr("backwards range '%d:%d' not allowed, did you mean '%d:%d'?", a, b, b, a)
			}
		case reFWNumber.MatchString(item):
			count++
			if n, _ := strconv.Atoi(item); n > 65535 {
				return formatErr("invalid port '%s'", item)
			}
		case dport && icmpTypeNames[item]:
			icmp = true
		case !etcServices[item]:
			return formatErr("invalid port '%s'", item)
		}
	}
	if icmp && count > 0 {
		return formatErr("ICMP ports not allowed in port range")
	}
	if count > 15 {
		return formatErr("too many entries in port list (> 15 numbers)")
	}
	return nil
}

func nonEmpty(l []string) []string {
	var out []string
	for _, s := range l {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func fwAddrs(v string) error {
	if reFWIPSet.MatchString(v) {
		if len(v) > 65 {
			return formatErr("ipset name too long")
		}
		return nil
	}
	if reFWAlias.MatchString(v) {
		if len(v) > 64 {
			return formatErr("alias name too long")
		}
		return nil
	}
	elems := strings.Split(v, ",")
	if strings.Join(nonEmpty(elems), ",") != v {
		return formatErr("extraneous commas in list")
	}
	version, ranges := 0, false
	for _, e := range elems {
		var addr netip.Addr
		if a, b, isRange := strings.Cut(e, "-"); isRange {
			ranges = true
			x, err1 := netip.ParseAddr(a)
			y, err2 := netip.ParseAddr(b)
			if err1 != nil || err2 != nil || y.Less(x) || x.Is4() != y.Is4() {
				return formatErr("invalid IP address: Invalid address %s", e)
			}
			addr = x
		} else if p, err := netip.ParsePrefix(e); err == nil {
			addr = p.Addr()
		} else if a, err := netip.ParseAddr(e); err == nil {
			addr = a
		} else {
			return formatErr("invalid IP address: Invalid IP %s", e)
		}
		nv := 4
		if addr.Is6() && !addr.Is4In6() {
			nv = 6
		}
		if version != 0 && version != nv {
			return formatErr("detected mixed ipv4/ipv6 addresses in address list '%s'", v)
		}
		version = nv
	}
	if ranges && len(elems) > 1 {
		return formatErr("you can't use a range in a list")
	}
	return nil
}
