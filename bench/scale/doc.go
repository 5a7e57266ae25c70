// Package scale measures the host guard on a busy node: a node namespace
// with N zone bridges (each with its gateway address and one guest port),
// the guard wired as the daemon wires it (Proxmox's SDN running config
// read by firewall/sdnzones and kicked by the guard's interface events,
// the sandbox API's zones beside it, the port map set every two seconds
// as firewall/portmap does), and these per-change paths timed at each
// size:
//
//   - start to ready: firewall.New, the port map, Start (verified), the
//     zones of the running config in force;
//   - new bridge to zone peers: the running config gains a zone with one
//     vnet and the vnet's bridge appears (pve-network's apply); the time
//     until @zone_peers holds "vnet . vnet", read from the kernel's
//     nftables events; 20 single bridges (p50, p99) and a burst of 50 at
//     once (until the last is in);
//   - port moved: a guest port leaves its zone bridge for a bridge of no
//     zone (and back), until @guest_ports of the layer-2 table follows;
//   - zone added: the sandbox API adds a zone of two existing bridges,
//     until @zone_peers holds the pair;
//   - lockdown flip: SetLockdown on or off, until @lockdown follows.
//
// After the burst the guard's Verify must find nothing to repair, and
// `nft list set inet pve-inspect zone_peers` must hold every new bridge.
// The ratio of each figure at the largest size to the smallest is printed.
// cmd/pve-inspect-bench runs it as section "scale"; it needs root.
package scale
