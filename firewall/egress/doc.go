// Package egress is the user-space half of the per-sandbox egress policy
// (DESIGN.md section 10); the kernel half is in package firewall.
//
//   - Policy/Rules (policy.go): mode open, allowlist or none; exact and
//     wildcard domains, IPv4 addresses and CIDRs to allow, CIDRs to deny.
//     Compile names the bad entry and changes nothing on error.
//   - Registry (registry.go): the rules of every zone with its own policy
//     and the node-wide default, kept equal to the guard's sets; a Set is
//     in the kernel when it returns.
//   - Resolver (resolver.go): the guard redirects guest DNS of allowlist
//     and none zones to it. Allowed names are forwarded upstream (only A)
//     and their addresses learned into the zone's set with clamped TTLs
//     before the guest sees the answer; every other name is NXDOMAIN with
//     no upstream query.
//   - Proxy (proxy.go, peek.go): tcp 80/443 to name-learned addresses is
//     redirected to it; it reads the TLS server_name or HTTP Host and
//     splices to the original destination only for an allowed name. No
//     TLS interception.
//   - Denials (denials.go): pve_inspect_egress_denied_total{sandbox,reason}
//     and the last refusals per sandbox.
//
// What stays possible, by design: a guest can present an allowed name to
// any address an allowed name resolved to, and a CDN serving many names on
// one address routes on the name inside the encrypted request, so
// "domain fronting" through an allowed CDN name reaches whatever that CDN
// serves. Connections to CIDR-allowed addresses are not peeked at all.
package egress
