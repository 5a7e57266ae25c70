package egress

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// MaxEntries bounds the allow and deny lists of one policy.
const MaxEntries = 256

// Policy is an egress policy as the API and the config file give it.
type Policy struct {
	// Mode is "open" (default), "allowlist" or "none".
	Mode string `json:"mode" toml:"mode"`
	// Allow lists exact domains (pypi.org), wildcard domains
	// (*.example.org: every name below it, not the name itself), either
	// with a tcp port (github.com:22), IPv4 addresses and IPv4 CIDRs.
	// Only allowlist mode uses it. A domain opens tcp 80 and 443 of the
	// addresses it resolves to, through the Host/SNI check; a domain:port
	// opens that tcp port of them by address alone (unchecked); a CIDR
	// opens every port and protocol.
	Allow []string `json:"allow,omitempty" toml:"allow"`
	// Deny lists IPv4 addresses and CIDRs never reachable, in any mode.
	Deny []string `json:"deny,omitempty" toml:"deny"`
}

// Rules is a validated policy.
type Rules struct {
	Mode firewall.EgressMode
	// Names are the exact allowed domains, lower case, no trailing dot.
	Names []string
	// Suffixes are the wildcard domains as ".example.org".
	Suffixes []string
	// Ports are the name:port entries, sorted (Name as in Names, or a
	// wildcard as in Suffixes).
	Ports []NamePort
	// Allow4 and Deny4 are the CIDRs.
	Allow4, Deny4 []netip.Prefix
}

// NamePort is a name:port entry: tcp Port of the addresses Name resolves
// to, opened by address alone. Name is exact (github.com) or a wildcard
// suffix (.github.com).
type NamePort struct {
	Name string
	Port uint16
}

func (n NamePort) matches(name string) bool {
	if strings.HasPrefix(n.Name, ".") {
		return strings.HasSuffix(name, n.Name)
	}
	return name == n.Name
}

func (n NamePort) String() string {
	if strings.HasPrefix(n.Name, ".") {
		return "*" + n.Name + ":" + strconv.Itoa(int(n.Port))
	}
	return n.Name + ":" + strconv.Itoa(int(n.Port))
}

// PolicyError names the entry of a policy that is wrong.
type PolicyError struct {
	Field string // "mode", "allow" or "deny"
	Entry string
	Msg   string
}

func (e *PolicyError) Error() string {
	if e.Entry == "" {
		return fmt.Sprintf("egress %s: %s", e.Field, e.Msg)
	}
	return fmt.Sprintf("egress %s entry %q: %s", e.Field, e.Entry, e.Msg)
}

// Compile validates p. Errors are *PolicyError.
func Compile(p Policy) (Rules, error) {
	mode, err := firewall.ParseEgressMode(p.Mode)
	if err != nil {
		return Rules{}, &PolicyError{Field: "mode", Entry: p.Mode, Msg: "want open, allowlist or none"}
	}
	r := Rules{Mode: mode}
	if len(p.Allow) > MaxEntries || len(p.Deny) > MaxEntries {
		return Rules{}, &PolicyError{Field: "allow", Msg: fmt.Sprintf("at most %d entries each in allow and deny", MaxEntries)}
	}
	if mode != firewall.EgressAllowlist && len(p.Allow) > 0 {
		return Rules{}, &PolicyError{Field: "allow", Msg: fmt.Sprintf("mode %s takes no allow list", mode)}
	}
	for _, l := range []struct {
		field   string
		entries []string
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		for _, e := range l.entries {
			if len(e) > MaxEntryChars {
				return Rules{}, &PolicyError{Field: l.field, Entry: e, Msg: fmt.Sprintf("want at most %d characters", MaxEntryChars)}
			}
		}
	}
	for _, e := range p.Allow {
		if pr, ok, err := parseCIDR(e); ok {
			if err != nil {
				return Rules{}, &PolicyError{Field: "allow", Entry: e, Msg: err.Error()}
			}
			r.Allow4 = append(r.Allow4, pr)
			continue
		}
		host, port, hasPort, err := splitPort(e)
		if err != nil {
			return Rules{}, &PolicyError{Field: "allow", Entry: e, Msg: err.Error()}
		}
		name, wild, err := parseDomain(host)
		if err != nil {
			return Rules{}, &PolicyError{Field: "allow", Entry: e, Msg: err.Error()}
		}
		if hasPort {
			np := NamePort{Name: name, Port: port}
			if wild {
				np.Name = "." + name
			}
			r.Ports = append(r.Ports, np)
			continue
		}
		if wild {
			r.Suffixes = append(r.Suffixes, "."+name)
		} else {
			r.Names = append(r.Names, name)
		}
	}
	for _, e := range p.Deny {
		pr, ok, err := parseCIDR(e)
		if !ok {
			err = errors.New("want an IPv4 address or CIDR")
		}
		if err != nil {
			return Rules{}, &PolicyError{Field: "deny", Entry: e, Msg: err.Error()}
		}
		r.Deny4 = append(r.Deny4, pr)
	}
	for _, s := range []*[]string{&r.Names, &r.Suffixes} {
		slices.Sort(*s)
		*s = slices.Compact(*s)
	}
	slices.SortFunc(r.Ports, func(a, b NamePort) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port))
	})
	r.Ports = slices.Compact(r.Ports)
	return r, nil
}

// splitPort splits "name:port"; hasPort is false without a colon. Ports
// 80 and 443 are refused: the name alone opens them, checked.
func splitPort(e string) (host string, port uint16, hasPort bool, err error) {
	host, ps, ok := strings.Cut(e, ":")
	if !ok {
		return e, 0, false, nil
	}
	if _, isCIDR, _ := parseCIDR(host); isCIDR {
		return "", 0, false, errors.New("a CIDR opens every port already; give it without a port")
	}
	n, perr := strconv.ParseUint(ps, 10, 16)
	if perr != nil || n == 0 {
		return "", 0, false, fmt.Errorf("port %q: want 1-65535", ps)
	}
	if n == 80 || n == 443 {
		return "", 0, false, fmt.Errorf("tcp %d of an allowed name is open through the Host/SNI check: list the name without a port", n)
	}
	return host, uint16(n), true, nil
}

// parseCIDR parses an IPv4 address or CIDR; ok is false when e does not
// look like an address at all (then it may be a domain).
func parseCIDR(e string) (netip.Prefix, bool, error) {
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return netip.Prefix{}, true, fmt.Errorf("bad CIDR: %w", err)
		}
		if !p.Addr().Is4() {
			return netip.Prefix{}, true, errors.New("only IPv4 (guests have no IPv6)")
		}
		if p.Masked() != p {
			return netip.Prefix{}, true, fmt.Errorf("host bits set (did you mean %s?)", p.Masked())
		}
		return p, true, nil
	}
	a, err := netip.ParseAddr(e)
	if err != nil {
		return netip.Prefix{}, false, nil
	}
	if !a.Is4() {
		return netip.Prefix{}, true, errors.New("only IPv4 (guests have no IPv6)")
	}
	return netip.PrefixFrom(a, 32), true, nil
}

// ParseDomain validates a (possibly wildcard) domain, as an allow entry
// takes it, and returns it lower case without the wildcard label and
// trailing dot.
func ParseDomain(e string) (name string, wildcard bool, err error) { return parseDomain(e) }

// parseDomain validates a (possibly wildcard) domain and returns it lower
// case without the wildcard label and trailing dot. Its last label starts
// with a letter (no top-level domain starts with a digit): a mistyped
// address (10.0.0.256, 010.0.0.1) is no domain. Only ASCII letters are
// lowered (strings.ToLower made the Kelvin sign a 'k').
func parseDomain(e string) (name string, wildcard bool, err error) {
	s := asciiLower(strings.TrimSuffix(e, "."))
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		s, wildcard = rest, true
	}
	if err := checkName(s); err != nil {
		return "", false, err
	}
	if !strings.Contains(s, ".") {
		return "", false, errors.New("want a domain with at least two labels (a wildcard over a top-level domain is too wide)")
	}
	if c := s[strings.LastIndexByte(s, '.')+1]; c < 'a' || c > 'z' {
		return "", false, errors.New("want a domain whose last label starts with a letter (an IPv4 address has four numbers of 0-255)")
	}
	return s, wildcard, nil
}

// asciiLower lowers the ASCII letters of s and nothing else.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// checkName checks DNS name syntax: labels of letters, digits, '-' and
// '_', 1-63 bytes, 253 in all.
func checkName(s string) error {
	if s == "" || len(s) > 253 {
		return errors.New("want a domain name of 1-253 characters")
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 {
			return errors.New("empty or over-long label")
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("character %q not allowed in a domain (wildcards only as a leading \"*.\")", c)
			}
		}
	}
	return nil
}

// AllowsName reports whether name (any case, trailing dot or not) is
// allowed through the Host/SNI check (tcp 80/443): an exact entry, or
// below a wildcard entry (name:port entries do not count).
func (r Rules) AllowsName(name string) bool {
	if r.Mode != firewall.EgressAllowlist {
		return r.Mode == firewall.EgressOpen
	}
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	if checkName(n) != nil {
		return false
	}
	if _, ok := slices.BinarySearch(r.Names, n); ok {
		return true
	}
	for _, s := range r.Suffixes {
		if strings.HasSuffix(n, s) {
			return true
		}
	}
	return false
}

// Resolves reports whether the resolver answers name: it is allowed
// (AllowsName) or has name:port entries.
func (r Rules) Resolves(name string) bool {
	return r.AllowsName(name) || (r.Mode == firewall.EgressAllowlist && len(r.PortsOf(name)) > 0)
}

// PortsOf returns the tcp ports name:port entries open for name, sorted.
func (r Rules) PortsOf(name string) []uint16 {
	if r.Mode != firewall.EgressAllowlist || len(r.Ports) == 0 {
		return nil
	}
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	if checkName(n) != nil {
		return nil
	}
	var out []uint16
	for _, p := range r.Ports {
		if p.matches(n) {
			out = append(out, p.Port)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Denies reports whether a falls in a deny CIDR.
func (r Rules) Denies(a netip.Addr) bool {
	for _, p := range r.Deny4 {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Zone is the kernel side of the rules.
func (r Rules) Zone() firewall.ZoneEgress {
	return firewall.ZoneEgress{Mode: r.Mode, Allow: slices.Clone(r.Allow4), Deny: slices.Clone(r.Deny4)}
}

// Policy turns the rules back into the API form.
func (r Rules) Policy() Policy {
	p := Policy{Mode: string(r.Mode)}
	p.Allow = append(p.Allow, r.Names...)
	for _, s := range r.Suffixes {
		p.Allow = append(p.Allow, "*"+s)
	}
	for _, np := range r.Ports {
		p.Allow = append(p.Allow, np.String())
	}
	for _, a := range r.Allow4 {
		p.Allow = append(p.Allow, a.String())
	}
	for _, d := range r.Deny4 {
		p.Deny = append(p.Deny, d.String())
	}
	return p
}
