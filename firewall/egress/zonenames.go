package egress

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
//
// A lease that has expired names nothing (its address may be another
// guest's by now), and what is read of a zone's file is dropped with the
// zone (Forget) and read again whenever the file is another one (inode),
// or its size or time changed: no host name of an address outlives the
// lease, the file or the zone it came from.
type LeaseNames struct {
	// LeaseFile returns the path of zone's lease file.
	LeaseFile func(zone string) string
	// Domain returns zone's DNS domain, "" for none.
	Domain func(zone string) string

	// Now is the clock leases expire by; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex // guards cache
	cache map[string]leaseCache
}

type leaseCache struct {
	ino   uint64
	mod   time.Time
	size  int64
	names map[string]time.Time // host -> lease expiry (zero: never)
}

// Forget drops what was read of zone's lease file (the zone is gone, or
// handed to a new tenant).
func (l *LeaseNames) Forget(zone string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.cache, zone)
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
	exp, ok := l.hosts(zone)[host]
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	return ok && (exp.IsZero() || exp.After(now()))
}

// hosts returns the host names of zone's lease file, read again when it
// changed.
func (l *LeaseNames) hosts(zone string) map[string]time.Time {
	path := l.LeaseFile(zone)
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.cache[zone]; ok && c.ino == ino && c.mod.Equal(fi.ModTime()) && c.size == fi.Size() {
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
	l.cache[zone] = leaseCache{ino: ino, mod: fi.ModTime(), size: fi.Size(), names: names}
	return names
}

// maxLeaseFile bounds the bytes of a lease file read.
const maxLeaseFile = 4 << 20

// leaseHosts parses dnsmasq lease lines ("<expiry> <MAC> <IP> <host>
// <client-id>", expiry in seconds since the epoch, 0 for an infinite
// lease) and returns the valid single-label host names, lower case ("*"
// is no name), each with its lease's expiry (the latest if several). The
// host names come from the guests: anything that is not a DNS label is
// skipped.
func leaseHosts(r io.Reader) map[string]time.Time {
	out := map[string]time.Time{}
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
		secs, err := strconv.ParseInt(string(fs[0]), 10, 64)
		if err != nil || secs < 0 {
			continue
		}
		exp := time.Time{}
		if secs > 0 {
			exp = time.Unix(secs, 0)
		}
		if prev, ok := out[h]; ok && (prev.IsZero() || !exp.IsZero() && prev.After(exp)) {
			continue
		}
		out[h] = exp
	}
	return out
}
