package probe

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Route flags of /proc/net/route and /proc/net/ipv6_route.
const (
	rtfUp     = 0x0001
	rtfReject = 0x0200
)

// ReadFacts gathers the local network facts: interfaces and their
// addresses (from the kernel), default routes (from root/proc/net/route and
// root/proc/net/ipv6_route) and resolvers (from root/etc/resolv.conf).
// What cannot be read is listed in Facts.Errors.
func ReadFacts(root string) Facts {
	if root == "" {
		root = "/"
	}
	var f Facts
	ifs, err := net.Interfaces()
	if err != nil {
		f.Errors = append(f.Errors, clip("interfaces: "+err.Error(), MaxDetailLen))
	}
	for _, ifc := range ifs {
		if len(f.Interfaces) == MaxInterfaces {
			break
		}
		i := Interface{Name: ifc.Name, Up: ifc.Flags&net.FlagUp != 0, Addrs: []string{}}
		addrs, err := ifc.Addrs()
		if err != nil {
			f.Errors = append(f.Errors, clip("addresses of "+ifc.Name+": "+err.Error(), MaxDetailLen))
		}
		for _, a := range addrs {
			if len(i.Addrs) == MaxAddrs {
				break
			}
			if ipn, ok := a.(*net.IPNet); ok {
				if p, err := netip.ParsePrefix(ipn.String()); err == nil {
					i.Addrs = append(i.Addrs, p.String())
				}
			}
		}
		f.Interfaces = append(f.Interfaces, i)
	}
	if f.Interfaces == nil {
		f.Interfaces = []Interface{}
	}
	if r, err := defaultRoute4(filepath.Join(root, "proc/net/route")); err != nil {
		f.Errors = append(f.Errors, clip(err.Error(), MaxDetailLen))
	} else {
		f.DefaultRoute4 = r
	}
	if r, err := defaultRoute6(filepath.Join(root, "proc/net/ipv6_route")); err != nil && !os.IsNotExist(err) {
		f.Errors = append(f.Errors, clip(err.Error(), MaxDetailLen))
	} else {
		f.DefaultRoute6 = r
	}
	res, err := resolvers(filepath.Join(root, "etc/resolv.conf"))
	if err != nil && !os.IsNotExist(err) {
		f.Errors = append(f.Errors, clip(err.Error(), MaxDetailLen))
	}
	f.Resolvers = res
	if len(f.Errors) > maxErrors {
		f.Errors = f.Errors[:maxErrors]
	}
	return f
}

// defaultRoute4 returns the up IPv4 default route with the lowest metric.
func defaultRoute4(path string) (*Route, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read routes: %w", err)
	}
	defer fh.Close()
	var best *Route
	bestMetric := uint64(1<<64 - 1)
	sc := bufio.NewScanner(fh)
	first := true
	for sc.Scan() {
		if first { // header line
			first = false
			continue
		}
		fl := strings.Fields(sc.Text())
		if len(fl) < 8 || fl[1] != "00000000" || fl[7] != "00000000" {
			continue
		}
		flags, err1 := strconv.ParseUint(fl[3], 16, 32)
		metric, err2 := strconv.ParseUint(fl[6], 10, 64)
		gw, err3 := strconv.ParseUint(fl[2], 16, 32)
		if err1 != nil || err2 != nil || err3 != nil || flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		if best != nil && metric >= bestMetric {
			continue
		}
		r := &Route{Iface: fl[0]}
		if gw != 0 {
			var b [4]byte
			binary.LittleEndian.PutUint32(b[:], uint32(gw)) // the kernel prints the network-order word as a host integer
			r.Gateway = netip.AddrFrom4(b).String()
		}
		best, bestMetric = r, metric
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read routes: %w", err)
	}
	return best, nil
}

// defaultRoute6 returns the up, non-reject IPv6 default route with the lowest metric.
func defaultRoute6(path string) (*Route, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var best *Route
	bestMetric := uint64(1<<64 - 1)
	sc := bufio.NewScanner(fh)
	zero := strings.Repeat("0", 32)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 10 || fl[0] != zero || fl[1] != "00" || fl[9] == "lo" {
			continue
		}
		metric, err1 := strconv.ParseUint(fl[5], 16, 32)
		flags, err2 := strconv.ParseUint(fl[8], 16, 32)
		if err1 != nil || err2 != nil || flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		if best != nil && metric >= bestMetric {
			continue
		}
		r := &Route{Iface: fl[9]}
		if b, err := hex.DecodeString(fl[4]); err == nil && len(b) == 16 {
			if a := netip.AddrFrom16([16]byte(b)); !a.IsUnspecified() {
				r.Gateway = a.String()
			}
		}
		best, bestMetric = r, metric
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read ipv6 routes: %w", err)
	}
	return best, nil
}

// resolvers returns the valid nameserver addresses of a resolv.conf.
func resolvers(path string) ([]string, error) {
	out := []string{}
	fh, err := os.Open(path)
	if err != nil {
		return out, err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() && len(out) < MaxAddrs {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 2 && fl[0] == "nameserver" {
			if a, err := netip.ParseAddr(fl[1]); err == nil {
				out = append(out, a.String())
			}
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read resolv.conf: %w", err)
	}
	return out, nil
}
