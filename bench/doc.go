// Package bench is what the sections of `make bench` (cmd/pve-inspect-bench)
// share: the [Config] every section gets, [Median], the scratch node
// namespace of the guard sections ([Node]), the one-guest test bed of the
// lockdown and guest agent sections ([OneGuestBed]), the emulator's node in
// a box ([EmuNode]) and an engine's API behind a loopback server ([Serve]).
//
// # Where things are
//
// One package per section, each measuring ours against its baseline side by
// side in one run and printing the figures the README's Performance tables
// quote:
//
//	bench/guard     the host guard's apply and route-change latency vs iptables scripts
//	bench/layer2    the guard's layer-2 table at 500 guest ports vs none
//	bench/lockdown  marker-to-enforced latency vs the reference design's 60 s timer
//	bench/qga       the guest agent client vs a raw loop and the Proxmox API's shape
//	bench/api       the sandbox API on the emulator and the bed vs the client it sits on
//	bench/egress    the egress checks vs an open zone
//	bench/connlookup a guest connection's interface: the kernel's ingress index vs a dump of every address
//	bench/scale     the guard's per-change paths at 1, 500 and 2000 bridges and ports
//	bench/container a one-container sandbox vs a one-VM sandbox of the same shape
//
// Each section package has the same files: bench.go measures (Options, a
// Result, Run) and section.go holds Section, which picks the sizes (full or
// -quick), brings up what the section needs and prints to [Config.Out].
// Adding a section is a new package with a Section function of type
// [Func] and one line in cmd/pve-inspect-bench/sections.go, the one list.
//
// A baseline is built in the section itself (the lockdown section's
// reference timer is a poller in bench/lockdown, not an option of the
// controller): product packages carry no bench-only options and never
// import bench/ (testvm/layout_test.go; only cmd/pve-inspect-bench and
// tests do). Go benchmarks (func Benchmark...) that use only a package's
// public behaviour may stay beside it.
package bench
