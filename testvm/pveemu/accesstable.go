package pveemu

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// sdnZoneRE is an SDN zone id (pve-network's pve-sdn-zone-id: 2 to 8
// characters), which "localnetwork" is not.
const sdnZoneRE = `[a-zA-Z][a-zA-Z0-9]{1,7}`

// placeholderRE is what each placeholder of an ACL path template stands
// for in a concrete path: one segment, an SDN zone, a host bridge with an
// optional VLAN, a zone and vnet with an optional VLAN.
var placeholderRE = map[string]string{
	access.PhZone:         sdnZoneRE,
	access.PhBridge:       `[^/]+(/[0-9]+)?`,
	access.PhTemplateVNet: sdnZoneRE + `/[^/]+(/[0-9]+)?`,
}

var reACLPlaceholder = regexp.MustCompile(`\\\{[a-z-]+\\\}`)

// aclPathRE turns a call's ACL path template into a pattern of the
// concrete paths it stands for.
func aclPathRE(tmpl string) *regexp.Regexp {
	re := reACLPlaceholder.ReplaceAllStringFunc(regexp.QuoteMeta(tmpl), func(m string) string {
		ph := strings.ReplaceAll(m, `\`, "")
		if r, ok := placeholderRE[ph]; ok {
			return r
		}
		return `[^/]+`
	})
	return regexp.MustCompile("^" + re + "$")
}

// AccessTableGaps lists what the emulator saw token do that calls (an
// access table: access.Calls, or a part of it) does not list: a request
// (method and route) no call names, and a privilege checked and held on
// a path where no call lists it (on an ACL path template that matches).
// It reads the requests (Requests) and the privilege checks recorded
// since RecordPermChecks.
func (s *Server) AccessTableGaps(calls []access.Call, token string) []string {
	var gaps []string
	listed := map[string]bool{}
	for _, c := range calls {
		listed[c.Method+" "+c.Path] = true
	}
	for _, r := range s.Requests() {
		k := r.Method + " " + r.Route
		if r.AuthID != token || r.Route == "" || listed[k] {
			continue
		}
		if !slices.Contains(gaps, "request "+k) {
			gaps = append(gaps, "request "+k)
		}
	}
	for _, pc := range s.PermChecks() {
		if pc.AuthID != token || !pc.OK {
			continue
		}
		for _, priv := range pc.Privs {
			covered := slices.ContainsFunc(calls, func(c access.Call) bool {
				return c.ACLPath != "" && slices.Contains(c.Privs, priv) && aclPathRE(c.ACLPath).MatchString(pc.Path)
			})
			if g := fmt.Sprintf("check %s on %s", priv, pc.Path); !covered && !slices.Contains(gaps, g) {
				gaps = append(gaps, g)
			}
		}
	}
	return gaps
}
