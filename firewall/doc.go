// Package firewall builds and keeps in force the host guard: one nftables
// table, inet pve-inspect, owned by the daemon (table flags owner|persist),
// that confines guests (DESIGN.md section 3).
//
// The desired table is data (Ruleset: sets, chains, rules with comments and
// counters) rendered by Render from a Config, the interface Classification
// and the lockdown Switches. A Guard applies it in one netlink batch through
// github.com/google/nftables and keeps it in force:
//
//	g, err := firewall.New(cfg, firewall.WithLogger(log))
//	err = g.Start(ctx)   // in force and verified when nil: signal readiness now
//	err = g.Run(ctx)     // route/link watch, nftables monitor, periodic verify
//	g.Close()            // the table stays (persist) for the next Start
//
// The lockdown controller drives it through SetLockdown, SetFailClosed,
// Management, Subscribe and Verify (a *DriftError names every difference);
// the sandbox API tells it the SDN zones it creates with SetZones.
//
// Ownership: the kernel binds an owned table to the netlink socket that
// created or adopted it; only that socket may change it, every other
// process gets EPERM, and "nft flush ruleset" skips it. With persist the
// table outlives its owner as an orphan (owner flag cleared). An orphan can
// be changed by anyone, and a process takes it over by sending NEWTABLE
// with owner|persist (the kernel then records its port id). Start does
// that, and in the same batch fixes whatever changed while no daemon ran:
// set members only (rules and counters kept), or a full rebuild (delete and
// re-create in one batch, so the table is never absent). A same-named table
// without persist is replaced the same way; one owned by a live process is
// an *OwnedError.
//
// Rules (hook, priority), each with a counter and a comment naming it:
//
//	prerouting -300  metadata4, metadata6: ip/ip6 daddr @metadataN drop
//	forward    -150  linklocal-saddr, ipv6, failclosed (meta nfproto @failclosed),
//	                 lockdown-in/out (iifname/oifname @lockdown),
//	                 cross-zone (iifname . oifname != @zone_peers between non-mgmt
//	                 interfaces), private4 (oifname @mgmt ip daddr @private4
//	                 not in @private4_allow), uplink-subnet (the same for the
//	                 subnets of the management interfaces: other nodes, the
//	                 router's admin side, even when they are public addresses)
//	input      -150  guest-input: not lo, @mgmt or @trusted -> guest_in:
//	                 ct established,related, udp 67-68, udp/tcp 53 accept; drop
//	output     -150  dnsmasq-lockdown: meta skuid <dnsmasq> oifname @lockdown drop
//
// Egress policy per zone (DESIGN.md section 10, egress.go): open,
// allowlist or none, keyed by the guest's incoming interface, evaluated
// after every rule above (the lockdown always wins):
//
//	forward    -150  egress-none (iifname @egress_none to @mgmt),
//	                 egress-deny (iifname . ip daddr @egress_deny4),
//	                 egress-allowlist (iifname @egress_allowlist: drop unless
//	                 iifname . ip daddr in @egress_allow4 or @egress_learned4)
//	egress_nat -100  guest DNS (udp/tcp 53, any server) from @egress_dns to the
//	                 daemon's resolver; tcp 80/443 from allowlist zones to
//	                 learned (not CIDR-allowed) addresses to the peek proxy
//	guest_in         the redirected resolver and proxy ports (ct status dnat)
//	output     -150  the daemon's marked upstream sockets: none under the
//	                 lockdown; the proxy's only to @mgmt, never private,
//	                 metadata, uplink subnets or IPv6
//
// @egress_learned4 (timeout flag) is filled by Learn from the resolver's
// answers and is the one set whose members Verify does not compare.
//
// Run-time state is set membership only (@mgmt, @lockdown, @failclosed,
// @zone_peers), so switches never rewrite a rule and counters survive.
package firewall
