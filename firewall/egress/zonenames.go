package egress

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// ZoneNames says which names a zone's own dnsmasq holds, so that the
// resolver can answer them under allowlist and none (the guests of one
// sample find each other by name) by asking that dnsmasq, and never sends
// it (or upstream) any other name.
type ZoneNames interface {
	// Holds reports whether the dnsmasq of zone answers name from its
	// own data (lower case, no trailing dot).
	Holds(zone, name string) bool
}

// LeaseNames implements ZoneNames from the zones' dnsmasq lease files:
// the host names guests took by DHCP, bare and under the zone's domain,
// and every name under the domain (the zone's dnsmasq must hold it as
// local, "local=/domain/", so it never recurses for it).
type LeaseNames struct {
	// LeaseFile returns the path of zone's lease file.
	LeaseFile func(zone string) string
	// Domain returns zone's DNS domain, "" for none.
	Domain func(zone string) string

	mu    sync.Mutex // guards cache
	cache map[string]leaseCache
}

type leaseCache struct {
	mod   time.Time
	size  int64
	names map[string]bool
}

// Holds implements ZoneNames.
func (l *LeaseNames) Holds(zone, name string) bool {
	if checkName(name) != nil {
		return false
	}
	dom := ""
	if l.Domain != nil {
		dom = strings.ToLower(strings.TrimSuffix(l.Domain(zone), "."))
	}
	if dom != "" && strings.HasSuffix(name, "."+dom) {
		return true
	}
	host := name
	if dom != "" {
		host = strings.TrimSuffix(name, "."+dom)
	}
	if strings.Contains(host, ".") || l.LeaseFile == nil {
		return false
	}
	return l.hosts(zone)[host]
}

// hosts returns the host names of zone's lease file, read again when it
// changed.
func (l *LeaseNames) hosts(zone string) map[string]bool {
	path := l.LeaseFile(zone)
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.cache[zone]; ok && c.mod.Equal(fi.ModTime()) && c.size == fi.Size() {
		return c.names
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	names := leaseHosts(io.LimitReader(f, maxLeaseFile))
	if l.cache == nil {
		l.cache = map[string]leaseCache{}
	}
	l.cache[zone] = leaseCache{mod: fi.ModTime(), size: fi.Size(), names: names}
	return names
}

// maxLeaseFile bounds the bytes of a lease file read.
const maxLeaseFile = 4 << 20

// leaseHosts parses dnsmasq lease lines ("<expiry> <MAC> <IP> <host>
// <client-id>") and returns the valid single-label host names, lower case
// ("*" is no name). The host names come from the guests: anything that is
// not a DNS label is skipped.
func leaseHosts(r io.Reader) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 4096)
	for sc.Scan() {
		fs := bytes.Fields(sc.Bytes())
		if len(fs) < 4 || string(fs[0]) == "duid" {
			continue
		}
		h := strings.ToLower(string(fs[3]))
		if h == "*" || strings.Contains(h, ".") || checkName(h) != nil {
			continue
		}
		out[h] = true
	}
	return out
}
