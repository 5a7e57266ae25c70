// Package l2observe watches, on the node, where a guest's frames arrive:
// the zone bridge's own device (what the node's stack receives) and every
// other port of that bridge (what the bridge forwards to sibling VMs and
// uplinks). The containment check (package containment) runs its layer-2
// probe inside this watch and judges "spoofed frame not seen" from it.
//
// Design decisions:
//
//   - Frames are matched by content, never by header fields a guest
//     controls: a nonce the node chose (anywhere in the frame), and ARP
//     frames that claim the gateway's address for a MAC that is not the
//     bridge's own. Whoever sent such a claim, it is a spoof.
//   - On the bridge device only received frames count; on the other ports
//     only frames the node transmits (the bridge forwarding them). The
//     probing guest's own port is not watched: what arrives there is the
//     raw, unfiltered input.
//   - The kernel runs the bridge family's netfilter hooks (prerouting,
//     input, forward) before a frame reaches the bridge device's packet
//     taps or leaves by another port, so a frame the layer-2 guard drops
//     is seen nowhere, and a frame it passes is seen.
//   - A watch that fails part-way returns an error, never fewer sightings:
//     "not seen" must mean "watched and absent".
//   - Sockets are created inside the bridge's network namespace (an
//     option, for the test bed) on a locked thread; they stay there.
package l2observe
