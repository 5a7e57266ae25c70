// Package sdnzones learns the SDN zones of a Proxmox VE node from the SDN
// configuration Proxmox has applied, so the host guard lets the vnets of
// one zone forward to each other (DESIGN.md section 10).
//
// pve-network writes the applied configuration on every "SDN apply" to
// /etc/pve/sdn/.running-config as one JSON object: a version counter and,
// per kind ("zones", "vnets", "subnets", "controllers", "fabrics"), an
// "ids" object keyed by object id. A vnet entry names its zone; each vnet
// is a Linux bridge of the same name. Parse reads that document strictly;
// Watcher polls the file and hands the zones to the guard.
//
// Design decisions:
//   - Fail safe. Zones only relax the guard's cross-zone rule between the
//     vnets of one zone; nothing here can open a path to the node, the
//     metadata services or the LAN. A vnet whose zone is missing, and every
//     bridge not in the file, stays isolated.
//   - A file that does not parse keeps the last good zones, counts an error
//     and logs it; it never empties or widens the map. An absent or empty
//     file means "SDN never applied" (pve-network reads both as {}): no
//     zones from this source.
//   - pmxcfs is a FUSE file system without inotify, so the watcher polls
//     size and modification time every few seconds, and re-reads at once
//     when told a new interface appeared (a vnet applied moments ago).
//   - Names must match pve-network's id formats (2-8 characters, a letter
//     first, letters and digits), so no name from the file can be longer
//     than an interface name or name an interface pattern.
package sdnzones
