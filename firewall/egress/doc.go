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
//     TLS interception. A name-learned address opens nothing else; a
//     name:port entry opens its tcp port of the name's addresses by
//     address alone (firewall.Opening).
//   - Generations (registry.go): every policy change of an interface
//     starts a new one; answers in flight for an older one are not
//     learned, the proxy's connections from it are closed, its learned
//     addresses forgotten, all before Set returns.
//   - Quotas (quota.go): per owner, UDP queries in flight and TCP
//     connections at the resolver, connections at the proxy, learned-set
//     elements (WithMaxLearned); refusals are denials with reason
//     "quota" and counted in pve_inspect_egress_quota_refused_total
//     {owner,resource,limit}. See "Egress quotas per owner" below.
//   - ZoneNames (zonenames.go): the names a zone's own dnsmasq holds are
//     answered by asking it, in every mode.
//   - VM names (vmnames.go): the names of a sandbox's VMs, handed over by
//     the engine (Registry.SetNames) for the zone's current instance, are
//     answered by the resolver itself to that sandbox's own guests, in
//     every mode, before anything else; they go with the instance.
//   - Denials (denials.go): pve_inspect_egress_denied_total{sandbox,reason}
//     and the last refusals per sandbox; both, and the owner's quota
//     refusal series, are dropped with the owner's instance.
//   - Log (log.go, logcount.go, logstore.go): the egress record, a ring
//     per owner instance with its counts (exported per owner at scrape
//     time), dropped with the instance; LogStore keeps the sandboxes'
//     rings on disk across restarts, read back only for the sandboxes
//     the engine kept, a file that is not one it wrote ignored.
//   - KernelDrops (kernel.go): the packets the kernel drops (a disallowed
//     or denied address, anything from a none zone) as denials with reason
//     "address", per sandbox, the destination among the recent ones, and
//     as refused flow records in the sandbox's egress record (one per
//     destination that grew in a read: its address, no port, the packets
//     and bytes dropped since the last read, no VM).
//
// Kernel drops: the guard's drop rules jump to a chain that updates two
// dynamic sets, one member per guest interface and one per interface and
// destination, each with its own counter, and drops. KernelDrops reads
// both every two seconds and attributes each member's growth by interface
// to the zone's owner through the Registry: the count from the interface
// set, which a guest cannot grow (its members are the node's interfaces),
// the destinations from the other, capped at firewall.EgressDeniedSize
// members that expire after two idle minutes. Chosen over an NFLOG group:
// no packet ever reaches the daemon, so a flooding guest costs it nothing
// (one netlink dump per read, bounded by the set sizes) and no rate limit
// has to drop log lines; allowed traffic never reaches the chain, and the
// kernel does the counting. What is lost: a destination set filled by a
// flood names no new destinations until members expire (the packets are
// still dropped and counted); a member that expires and comes back with
// more packets than it had, within one read interval, is undercounted;
// drops between the last read of one daemon and the first of the next
// (the baseline) are not counted per sandbox (the per-rule counters of
// pve_inspect_guard_rule_drop_packets_total have them).
//
// Egress quotas per owner: an owner is a sandbox (its zone's policy is
// the daemon's), or a zone the daemon did not create, each of those its
// own ("zone:<id>"; an interface of no known zone "iface:<name>"), so no
// two tenants share a share. Every shared resource has a per-owner share
// and a node total of share times ResolverConfig.Owners /
// ProxyConfig.Owners ([egress] owners), so that that many owners at their
// share all fit. The owner's share is checked first: an owner past it is
// refused without taking a unit of the node total (the resolver's UDP
// read loop names the query's interface and takes the share before a
// goroutine starts), so a flooding owner holds at most its share of
// anything. Learned addresses are counted as the kernel counts them, as
// elements of its sets: an address behind the name check is one, each
// port of a name:port entry one more; the node total is the set's size.
//
// Nothing outlives its instance: what is kept of an owner (its recent
// denials, its counter series, its interfaces' learned elements and
// generations, what was read of its zone's lease file) is dropped when
// the zone goes (Registry.Remove) and when the same zone is handed to a
// new tenant (Registry.Begin, a pool member claimed), under the
// registry's lock; a denial decided under an older policy is recorded
// only while that policy is in force (Registry.IfCurrent), and kernel
// drops read across a new instance (a claim, the zone removed or given to
// another owner) are a new baseline, written (counts, noted destinations,
// records) only while the instance they were attributed to is current
// (Registry.IfInstance); across a policy change of the same instance
// they are that instance's. A lease names
// its host only until it expires.
//
// What stays possible, by design: a guest can present an allowed name to
// any address an allowed name resolved to, and a CDN serving many names on
// one address routes on the name inside the encrypted request, so
// "domain fronting" through an allowed CDN name reaches whatever that CDN
// serves. Connections to CIDR-allowed addresses are not peeked at all.
package egress
