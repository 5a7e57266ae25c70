package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrURLRefused is wrapped by URLGuard.Check's refusals.
var ErrURLRefused = errors.New("image URL refused")

// metadataPrefixes are the cloud metadata services (DESIGN.md section 3)
// beside link-local: Alibaba, Azure's WireServer, AWS's IPv6 IMDS.
var metadataPrefixes = []netip.Prefix{
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

// URLGuard decides whether a build asked over the API may have the node
// download a URL. download-url runs on the node as Proxmox (root): a URL
// naming the node itself (its loopback, any of its interface addresses),
// a link-local address (169.254.0.0/16, fe80::/10: the metadata service
// of most clouds) or another metadata service would let a caller of the
// API read, or probe, what only the node reaches. Refused: a scheme other
// than http and https, credentials in the URL (they would be logged), and
// a host any of whose addresses is loopback, link-local, unspecified,
// multicast, a metadata address (the built-ins and Metadata) or one of
// the node's own. The check resolves the name when it is asked; Proxmox
// resolves it again when it downloads (a name whose answer changes in
// between is not caught), and the checksum the request must carry is
// what the image is held to. The daemon's own fetches are checked again
// at each connection (Control, GuardedClient).
type URLGuard struct {
	// Resolve returns a host name's addresses.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Own returns the node's own addresses (nil: none beyond loopback).
	Own func() ([]netip.Addr, error)
	// Metadata are further metadata prefixes refused ([guard] metadata4,
	// metadata6).
	Metadata []netip.Prefix
}

// Check returns nil when the node may download raw, else an error
// wrapping ErrURLRefused that says which address is refused and why.
func (g URLGuard) Check(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return fmt.Errorf("%w: %q: want an http or https URL", ErrURLRefused, raw)
	}
	if u.User != nil {
		return fmt.Errorf("%w: %q carries credentials: serve the image without them", ErrURLRefused, u.Redacted())
	}
	host := u.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		if g.Resolve == nil {
			return fmt.Errorf("%w: %q: no resolver to check its host with", ErrURLRefused, raw)
		}
		if addrs, err = g.Resolve(ctx, host); err != nil {
			return fmt.Errorf("%w: resolve %s: %v", ErrURLRefused, host, err)
		}
		if len(addrs) == 0 {
			return fmt.Errorf("%w: %s has no address", ErrURLRefused, host)
		}
	}
	var own []netip.Addr
	if g.Own != nil {
		if own, err = g.Own(); err != nil {
			return fmt.Errorf("%w: list the node's addresses: %v", ErrURLRefused, err)
		}
	}
	for _, a := range addrs {
		if why := g.refused(a, own); why != "" {
			return fmt.Errorf("%w: %s is %s (%s): the node would download from what only it reaches; serve the image from another host", ErrURLRefused, host, a, why)
		}
	}
	return nil
}

// refused says why address a is refused, the IPv4 address a NAT64 or
// 6to4 address carries included ("" when it is not).
func (g URLGuard) refused(a netip.Addr, own []netip.Addr) string {
	why := g.why(a.Unmap(), own)
	if v4, ok := embeddedIPv4(a); ok && why == "" {
		if why = g.why(v4, own); why != "" {
			why = "an IPv6 address carrying " + v4.String() + ": " + why
		}
	}
	return why
}

// Control is a net.Dialer's Control refusing a connection to an address
// Check refuses (an error wrapping ErrURLRefused). Check resolves a URL's
// host when it is asked and the connection resolves it again: a host
// whose answer changes in between (a public address for the check, then
// 169.254.169.254, loopback or the node's own: DNS rebinding, by a mirror
// or any host it redirects to) would otherwise have the daemon's own
// fetch reach what the guard refuses. GuardedClient dials through it;
// Proxmox's download-url resolves in its own process, out of its reach.
func (g URLGuard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: connect to %q (%s): not an address", ErrURLRefused, address, network)
	}
	var own []netip.Addr
	if g.Own != nil {
		if own, err = g.Own(); err != nil {
			return fmt.Errorf("%w: list the node's addresses: %v", ErrURLRefused, err)
		}
	}
	if why := g.refused(ap.Addr(), own); why != "" {
		return fmt.Errorf("%w: connect to %s (%s): the host's address changed since it was checked, or a proxy on it: the node would fetch from what only it reaches", ErrURLRefused, ap.Addr(), why)
	}
	return nil
}

// GuardedClient is the HTTP client of the daemon's own fetches for
// builds over the API (NodeHost.HTTPClient: checksum lists, kali2025.4's
// archive): http.DefaultTransport's settings, every connection's address
// checked by g (Control) after the name was resolved for it. A proxy the
// environment names is connected to through the same check, so one on the
// node itself is refused.
func GuardedClient(g URLGuard) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: g.Control}).DialContext
	return &http.Client{Transport: t}
}

// why says why address a is refused ("" when it is not).
func (g URLGuard) why(a netip.Addr, own []netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "link-local, where cloud metadata services answer"
	case a.IsUnspecified():
		return "unspecified: the node itself"
	case a.IsMulticast():
		return "multicast"
	}
	for _, p := range append(append([]netip.Prefix{}, metadataPrefixes...), g.Metadata...) {
		if p.Contains(a) {
			return "a cloud metadata service"
		}
	}
	for _, o := range own {
		if o.Unmap() == a {
			return "one of the node's own addresses"
		}
	}
	return ""
}

// The IPv6 prefixes whose addresses carry an IPv4 address a node with
// the routes for them reaches: NAT64 (RFC 6052 64:ff9b::/96, its last 32
// bits; RFC 8215 64:ff9b:1::/48, the same) and 6to4 (RFC 3056 2002::/16,
// bits 16 to 47).
var (
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local     = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour      = netip.MustParsePrefix("2002::/16")
)

// embeddedIPv4 is the IPv4 address a NAT64 or 6to4 address carries.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() || a.Is4In6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case nat64WellKnown.Contains(a), nat64Local.Contains(a):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// RedactURL is raw without credentials or query, for logs and events.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return strings.TrimSuffix(u.String(), "?")
}
