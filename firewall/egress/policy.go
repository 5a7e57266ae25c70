package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
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
	// (*.example.org: every name below it, not the name itself), IPv4
	// addresses and IPv4 CIDRs. Only allowlist mode uses it.
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
	// Allow4 and Deny4 are the CIDRs.
	Allow4, Deny4 []netip.Prefix
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
	for _, e := range p.Allow {
		if pr, ok, err := parseCIDR(e); ok {
			if err != nil {
				return Rules{}, &PolicyError{Field: "allow", Entry: e, Msg: err.Error()}
			}
			r.Allow4 = append(r.Allow4, pr)
			continue
		}
		name, wild, err := parseDomain(e)
		if err != nil {
			return Rules{}, &PolicyError{Field: "allow", Entry: e, Msg: err.Error()}
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
	return r, nil
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

// parseDomain validates a (possibly wildcard) domain and returns it lower
// case without the wildcard label and trailing dot.
func parseDomain(e string) (name string, wildcard bool, err error) {
	s := strings.ToLower(strings.TrimSuffix(e, "."))
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		s, wildcard = rest, true
	}
	if err := checkName(s); err != nil {
		return "", false, err
	}
	if !strings.Contains(s, ".") {
		return "", false, errors.New("want a domain with at least two labels (a wildcard over a top-level domain is too wide)")
	}
	return s, wildcard, nil
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
// allowed: an exact entry, or below a wildcard entry.
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
	for _, a := range r.Allow4 {
		p.Allow = append(p.Allow, a.String())
	}
	for _, d := range r.Deny4 {
		p.Deny = append(p.Deny, d.String())
	}
	return p
}
