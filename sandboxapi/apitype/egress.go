package apitype

import "time"

// EgressPolicy is a sandbox's egress policy (DESIGN.md section 10).
type EgressPolicy struct {
	// Mode is "open" (default), "allowlist" or "none".
	Mode string `json:"mode"`
	// Allow lists exact domains, wildcard domains ("*.example.org"),
	// either with a tcp port ("github.com:22"), IPv4 addresses and CIDRs;
	// allowlist mode only. A domain opens tcp 80/443 of its addresses
	// through the Host/SNI check, a domain:port that port by address
	// alone (unchecked), a CIDR everything.
	Allow []string `json:"allow,omitempty"`
	// Deny lists IPv4 addresses and CIDRs never reachable, in any mode.
	Deny []string `json:"deny,omitempty"`
}

// EgressDenial is one refused name or connection.
type EgressDenial struct {
	Time time.Time `json:"time"`
	// Reason is name, mode, sni, host, peek, address or quota.
	Reason string `json:"reason"`
	// Name is the refused DNS name, Host or SNI, when there is one.
	Name string `json:"name,omitempty"`
	// Dest is the destination: address:port for a refused connection, the
	// address alone for reason address (a kernel drop, counted per packet).
	Dest string `json:"dest,omitempty"`
}

// EgressStatus is a sandbox's policy in force and its recent denials.
type EgressStatus struct {
	Sandbox string         `json:"sandbox"`
	Policy  EgressPolicy   `json:"policy"`
	Denials []EgressDenial `json:"denials"`
}
