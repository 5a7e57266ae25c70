// Package portmap builds the layer-2 guard's port map (firewall.Port: a
// guest's bridge port, its MAC and its assigned IPv4) from what a Proxmox
// node keeps on disk, for every guest of the node (VMs and containers),
// whoever created its zone:
//
//   - the MAC of each NIC: netN in /etc/pve/qemu-server/<vmid>.conf
//     (qemu-server's net format: "<model>=<MAC>,bridge=<vnet>,...") or,
//     for a container, in /etc/pve/lxc/<vmid>.conf (pve-container's:
//     "name=eth0,bridge=<vnet>,hwaddr=<MAC>,...");
//   - the port names: tap<vmid>i<n> (a VM) or veth<vmid>i<n> (a
//     container), and fwpr<vmid>p<n> when the NIC has the Proxmox
//     firewall on (pve-common's PVE/Network.pm);
//   - the IPv4: the zone dnsmasq's static mappings
//     (/etc/dnsmasq.d/<zone>/ethers, "MAC,IPv4[,[IPv6]]", written by
//     pve-network from its IPAM) and its leases
//     (/var/lib/misc/dnsmasq.<zone>.leases).
//
// Every file is read through a configurable root, bounded in size, and
// parsed strictly: a line that does not parse is skipped and reported,
// never guessed at. A NIC without an address stays mapped by MAC only (the
// guard lets it do DHCP and nothing else); a port of no guest stays
// unmapped.
package portmap
