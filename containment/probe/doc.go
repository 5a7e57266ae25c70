// Package probe is the guest side of the containment check (DESIGN.md
// section 7) and the host's strict parser of what it prints.
//
// The probe runs inside a sandbox VM or container as a small static program
// (cmd/pve-inspect-probe, CGO_ENABLED=0). It reads a [Request] (a JSON list
// of targets) and writes one [Report]: per target an [Outcome] that keeps
// apart the answers a firewall can produce (open, refused, timeout,
// unreachable, DNS reply, DNS no reply, UDP reply), plus local [Facts]
// (IPv4 lease and default route, resolvers) that the host uses as positive
// controls. The layer-2 kinds (layer2.go) send crafted Ethernet frames
// through a raw packet socket on the default-route interface (the probe
// runs as root in the guest) and report [OutcomeSent]: only the node sees
// where they went. The local kinds (local.go) make harmless system calls
// on the kernel the probe runs on and report the kernel's answers (errno
// names, an id map): a container's rows, judged by the host.
//
// Design decisions:
//
//   - The probe reports what it saw and never judges it: whether "refused"
//     is good or bad is the host's business (a refused connection proves a
//     route exists, so the host counts it as reachable).
//   - An HTTP or TLS failure after the TCP handshake is reported as
//     [OutcomeOpen] with the error as detail: the route exists.
//   - A udp target ([KindUDP]) sends its payload (a DNS query, an NTP
//     client request, or a short datagram) on a connected socket, so the
//     kernel reports the ICMP errors that come back: port unreachable as
//     [OutcomeRefused], host/net/prohibited as [OutcomeUnreachable]. Before
//     any target runs, the probe sends a canary to a random closed port
//     (61000-65535) on every udp target's address and reports its outcome
//     in [Result.Canary]: the host judges silence by it.
//   - The keep-alive kind ([KindKeepAlive], keepalive.go) is the one
//     target with two phases: the probe tells the host on stderr
//     ([ReadyPrefix]) that its first request was answered and waits for
//     a signal file the host creates once it changed the policy; stdout
//     stays the one report.
//   - The output crosses the guest boundary, and the guest is hostile: the
//     host reads it only through [ParseReport], which is strict (known fields,
//     known values, one JSON value, bounded sizes and counts) and fuzzed.
//   - All sockets come from a [Dialer], so tests can create them inside a
//     network namespace; the program uses a plain net.Dialer. No proxy from
//     the environment is ever used and redirects are not followed.
//   - The probe depends on the standard library (syscall for the packet
//     socket), golang.org/x/net/dns/dnsmessage and golang.org/x/sys/unix
//     (the local kinds' calls) only, to stay small.
package probe
