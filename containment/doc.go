// Package containment runs the containment check of DESIGN.md section 7:
// from inside a sandbox VM or container, try every way out that a hostile
// guest would try, and compare what answered with what the node's mode
// promises.
//
// [NewPlan] turns a [Spec] (the VM's zone gateway, the host's addresses and
// ports, metadata endpoints, another zone's guest, LAN, public and IPv6
// addresses, DNS names) and a [Policy] (what each category should be:
// reachable or blocked) into checks. A [Runner] uploads the probe program
// (package probe) through a [Guest], runs it, parses its report strictly and
// [Evaluate]s it into a [Result]: one [Row] per check with expected and
// observed verdicts, the observed detail, and PASS, FAIL or UNPROVEN.
//
// [SandboxChecker] (sandboxcheck.go) is the check as the sandbox engine
// runs it: it satisfies sandbox.Checker itself, filling the per-sandbox
// part of the Spec around the node-wide part the daemon supplies.
//
// With [Spec].Layer2 the plan also has the layer-2 rows (layer2.go): the
// guest, root in its VM, sends forged frames through a raw socket, each
// carrying a nonce the node chose: a datagram from another address of its
// subnet (spoofed source address), one from a random locally administered
// MAC (spoofed MAC), and a gratuitous ARP request and reply claiming the
// gateway's address. The Runner's [Layer2Observer] (package l2observe)
// watches the node side of the VM's zone bridge while the probe runs: the
// bridge device (the node) and every other port (sibling VMs, uplinks). A
// forged frame seen there is a leak; the layer-2 guard (firewall, the
// bridge table) must keep all three unseen. Their positive control is a
// legitimate datagram sent the same raw way, which the node must see.
//
// With [Spec].Container the plan also has the container rows
// (container.go): a container shares the node's kernel, so the probe, as
// the container's root, tries what only the node's root may do (its id
// map, the node's /proc/sys and /sys, mounting a disk, file handles,
// keyrings, kernel modules, a nested container) and the rows expect the
// kernel to refuse. A container's probe runs through the engine's guest
// of it ([EngineGuest]: ctguest enters the container from the node); a
// VM's through its guest agent ([AgentGuest]).
//
// Design decisions:
//
//   - A refused connection proves a route exists: it counts as reachable.
//     So does an HTTP or TLS failure after the TCP handshake.
//   - UDP (the node's DNS, NTP, SNMP and corosync ports on every node
//     address; DNS and SNMP on LAN addresses and other zones' guests): a
//     reply or an ICMP port unreachable is reachable, an ICMP host, net or
//     prohibited unreachable is blocked, and silence is decided by a
//     canary, a closed high port on the same address the probe tries
//     first: if it comes back port unreachable, the silent port took the
//     datagram (reachable); if it is silent too, blocked. The full rule, and
//     what ICMP rate limits do to it, is in udp.go.
//   - Positive controls keep a dead network from reading as a pass: the VM
//     has a DHCP lease (an IPv4 in the zone subnet on the default-route
//     interface, default route via the zone gateway), the zone resolver
//     answers a local name, and when the policy lets guests reach the
//     internet, the public address answers. For UDP, a closed port on the
//     guest's own loopback (and, when the internet is promised, on the
//     public address) must come back port unreachable, so a probe that
//     cannot read ICMP errors never reads everything as blocked. A failed
//     control fails the check, and every "blocked as expected" row is then
//     UNPROVEN, not PASS.
//   - Expectations come from the caller's Policy, so one runner serves
//     "guard on", "lockdown on" and the test bed's honesty test where
//     everything must be reachable.
//   - The probe's output is hostile guest data: size-bounded by the guest
//     agent client, then bounded again and strictly validated by
//     probe.ParseReport; every requested id must come back exactly once.
//   - The layer-2 verdicts come from the node, never from the guest: the
//     probe only says it sent. A guest that does not send its forgeries
//     reads as "blocked" only if it still sends the control, which uses
//     the same raw path; a failed watch (a missing bridge, frames the
//     kernel dropped from the watch's buffer) is an error, not "unseen".
//   - A busy node must still be checkable: every zone gateway is a node
//     address with up to nine control-plane rows, and every other
//     sandbox's guest has its own rows. The probe takes up to
//     probe.MaxTargets rows (its worst-case report of that many stays
//     within probe.MaxReportBytes, far below the guest agent's output
//     cap), the [Runner] raises its concurrency with the rows (one probe
//     per [RowsPerProbe] rows, up to probe.MaxConcurrency), and the exec
//     timeout is probe.RunBound (every round of rows its full timeout,
//     blocked rows being silent until then, after the UDP canary phase)
//     plus slack. The probe itself stops at probe.RunBound plus
//     probe.RunGrace, less than that slack, and reports: a row it cut
//     short is an error (no verdict: silence cut short proves nothing),
//     so a guest too busy to finish in time yields a report naming the
//     unfinished rows, not a killed probe. A plan has a row budget ([DefaultBudget], about a
//     minute of blocked rows at the default 3 s timeout): a node with 60
//     other sandboxes gets every row. Over the budget, the rows of other zones'
//     gateways and guests and of LAN targets are sampled, whole addresses
//     at a time, in a window that rotates from run to run, while every
//     row about the node's own addresses and the VM's zone is always
//     probed. The rows a run leaves out are no rows of the [Result]
//     (neither PASS nor FAIL); its [Sampling] counts and names them and
//     says the next run probes others (sample.go).
//   - The check trusts the guest to run the probe faithfully. Run it on a
//     VM the agent has not touched yet (right after create); a guest that
//     already runs hostile code can fake "blocked" but never "reachable".
package containment
