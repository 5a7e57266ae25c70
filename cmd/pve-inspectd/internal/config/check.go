package config

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/containment"
	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// CheckSection configures the containment check (`pve-inspectd check` and
// the API's check endpoint).
type CheckSection struct {
	// ProbePath is the static probe binary uploaded into guests.
	ProbePath string `toml:"probe_path"`
	// GuestDir is the guest directory the probe is uploaded to.
	GuestDir string `toml:"guest_dir"`
	// Timeout bounds each probe target.
	Timeout time.Duration `toml:"timeout"`
	// Concurrency is the least number of parallel probes inside the
	// guest; a plan with many rows gets more (containment.Runner).
	Concurrency int `toml:"concurrency"`
	// Budget is the most rows one check probes before the rows aimed at
	// other sandboxes' gateways and guests and at LAN targets are sampled,
	// a different window each run (containment.Spec.Budget).
	Budget int `toml:"budget"`
	// LAN are operator-LAN targets (ip:port) that guests must not reach.
	LAN []string `toml:"lan"`
	// Public are public IPv4 addresses probed on 80 and 443: reachable is
	// a positive control unless the lockdown is on. Required for the
	// check when the API is on.
	Public []string `toml:"public"`
	// Public6 are public IPv6 addresses guests must not reach (no IPv6).
	Public6 []string `toml:"public6"`
	// ExternalName is resolved through the zone resolver to tell whether it
	// recurses; "{random}" in it becomes a fresh label (a name no cache
	// holds). Required for the check when the API is on.
	ExternalName string `toml:"external_name"`
	// LocalName is a name the zone resolver answers itself (the DNS
	// positive control); "{zone}" becomes the sandbox's zone id.
	LocalName string `toml:"local_name"`
	// EgressAllowedName, EgressDeniedName and EgressDeniedAddr aim the
	// egress rows of an allow-list sandbox: a name its policy allows that
	// serves HTTPS, a name it does not allow, an IPv4 address it does not
	// allow (optional). Rows are added only when the sandbox's policy
	// really allows the first and not the second.
	EgressAllowedName string `toml:"egress_allowed_name"`
	EgressDeniedName  string `toml:"egress_denied_name"`
	EgressDeniedAddr  string `toml:"egress_denied_addr"`
}

// LANAddrs parses LAN.
func (s CheckSection) LANAddrs() []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range s.LAN {
		if ap, err := netip.ParseAddrPort(a); err == nil {
			out = append(out, ap)
		}
	}
	return out
}

// PublicAddrs parses Public and Public6.
func (s CheckSection) PublicAddrs() (v4, v6 []netip.Addr) {
	for _, a := range s.Public {
		if ip, err := netip.ParseAddr(a); err == nil {
			v4 = append(v4, ip)
		}
	}
	for _, a := range s.Public6 {
		if ip, err := netip.ParseAddr(a); err == nil {
			v6 = append(v6, ip)
		}
	}
	return v4, v6
}

// minCheckBudget is the smallest [check] budget: below it a check would
// leave out most other-zone rows on even a small node.
const minCheckBudget = 64

// defaultCheck is the check section's defaults.
func defaultCheck() CheckSection {
	return CheckSection{
		ProbePath:   containment.DefaultProbePath,
		GuestDir:    "/tmp",
		Timeout:     3 * time.Second,
		Concurrency: 16,
		Budget:      containment.DefaultBudget,
		LAN:         []string{},
		Public:      []string{},
		Public6:     []string{},
	}
}

func (s CheckSection) validate(prefix string) error {
	switch {
	case !filepath.IsAbs(s.ProbePath):
		return &KeyError{Key: prefix + ".probe_path", Err: fmt.Errorf("%q: want an absolute path", s.ProbePath)}
	case !filepath.IsAbs(s.GuestDir):
		return &KeyError{Key: prefix + ".guest_dir", Err: fmt.Errorf("%q: want an absolute path", s.GuestDir)}
	case s.Timeout <= 0 || s.Timeout > probe.MaxTimeoutMS*time.Millisecond:
		return &KeyError{Key: prefix + ".timeout", Err: fmt.Errorf("%v: want more than 0 and at most %v", s.Timeout, probe.MaxTimeoutMS*time.Millisecond)}
	case s.Concurrency < 1 || s.Concurrency > 64:
		return &KeyError{Key: prefix + ".concurrency", Err: errors.New("want 1..64")}
	case s.Budget < minCheckBudget || s.Budget > probe.MaxTargets:
		return &KeyError{Key: prefix + ".budget", Err: fmt.Errorf("%d: want %d..%d", s.Budget, minCheckBudget, probe.MaxTargets)}
	case len(s.ExternalName) > 200 || strings.ContainsAny(s.ExternalName, " \t\n/"):
		return &KeyError{Key: prefix + ".external_name", Err: fmt.Errorf("%q: not a DNS name", s.ExternalName)}
	case len(s.LocalName) > 200 || strings.ContainsAny(s.LocalName, " \t\n/"):
		return &KeyError{Key: prefix + ".local_name", Err: fmt.Errorf("%q: not a DNS name", s.LocalName)}
	}
	for _, a := range s.LAN {
		if _, err := netip.ParseAddrPort(a); err != nil {
			return &KeyError{Key: prefix + ".lan", Err: fmt.Errorf("%q: want ip:port", a)}
		}
	}
	for _, a := range s.Public {
		if ip, err := netip.ParseAddr(a); err != nil || !ip.Is4() {
			return &KeyError{Key: prefix + ".public", Err: fmt.Errorf("%q: want an IPv4 address", a)}
		}
	}
	for k, n := range map[string]string{"egress_allowed_name": s.EgressAllowedName, "egress_denied_name": s.EgressDeniedName} {
		if len(n) > 200 || strings.ContainsAny(n, " \t\n/*") {
			return &KeyError{Key: prefix + "." + k, Err: fmt.Errorf("%q: not a DNS name", n)}
		}
	}
	if s.EgressDeniedAddr != "" {
		if ip, err := netip.ParseAddr(s.EgressDeniedAddr); err != nil || !ip.Is4() {
			return &KeyError{Key: prefix + ".egress_denied_addr", Err: fmt.Errorf("%q: want an IPv4 address", s.EgressDeniedAddr)}
		}
	}
	for _, a := range s.Public6 {
		if ip, err := netip.ParseAddr(a); err != nil || !ip.Is6() || ip.Is4In6() {
			return &KeyError{Key: prefix + ".public6", Err: fmt.Errorf("%q: want an IPv6 address", a)}
		}
	}
	return nil
}
