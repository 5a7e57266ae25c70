package sandbox

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Fixed MACs and addresses: a VM's NIC may ask for a MAC and an IPv4
// address of its own (apitype.NIC), as the reference plugin's
// VmNicConfig(mac=, ipv4=) does, on stock Proxmox.
//
// Design decisions:
//
//   - The address is Proxmox's IPAM DHCP mapping: an IPAM entry of the
//     address for the NIC's MAC, which a start's pve-bridge hook maps in
//     the zone's dnsmasq (pve-network Vnets.pm add_dhcp_mapping: the MAC's
//     IPv4 address by get_ips_from_mac, one allocated only when it has
//     none; Dhcp.pm add_mapping writes "MAC,IP" to the zone's ethers). The
//     guest gets it by DHCP; nothing is written into the guest.
//   - Order, all before the VMs start: (1) once the sandbox's SDN is
//     applied, before any NIC of the sandbox is configured, every fixed
//     address is reserved for its NIC's MAC (POST
//     /cluster/sdn/vnets/{vnet}/ips: Ips.pm ipcreate, Vnets.pm add_ip;
//     add_ip reads the vnet's running subnets, hence after the apply), so
//     that no sibling's NIC takes it from the DHCP range first. (2) The
//     NIC is configured with that MAC; qemu-server gives it an address of
//     the DHCP range all the same (QemuServer.pm vmconfig_apply_pending ->
//     Vnets.pm add_next_free_cidr, which does not look the MAC up: the
//     reference plugin patches pve-network for that, this daemon runs on
//     stock Proxmox), and Proxmox's cache of the MAC's address (Ipams.pm
//     add_cache_mac_ip, cluster-wide, keyed by the MAC alone) now names
//     that one. (3) That entry is deleted (DELETE .../ips with the MAC:
//     Subnets.pm del_ip drops the MAC's cache entry too), so the start's
//     get_ips_from_mac finds the MAC's one entry left, the fixed address,
//     in the IPAM (PVEPlugin.pm get_ips_from_mac) and maps it.
//   - A network of dhcp off (a subnet without a dhcp-range) takes the same
//     steps: the reservation takes any address of the vnet's running
//     subnets (Subnets.pm add_ip, ranges not looked at), the configure
//     gives the NIC another of the whole prefix (Subnets.pm
//     add_next_free_ip -> PVEPlugin.pm add_next_freeip, which passes held
//     addresses), and the start maps the fixed one (add_dhcp_mapping,
//     ranges not looked at), which the zone's dnsmasq serves through the
//     subnet's static range (Dhcp/Dnsmasq.pm configure_subnet, written for
//     every subnet of the zone).
//   - Proxmox's start misses the MAC cache for such a NIC (step 3 dropped
//     the MAC's entry), and a miss rewrites the whole cache without its
//     lock (Ipams.pm get_ips_from_mac: read_macdb, the IPAM looked up,
//     write_macdb, where add_cache_mac_ip and del_cache_mac_ip hold
//     cfs_lock_file): a step 3 of another NIC that lands between that
//     read and that write is undone, the other MAC's range address cached
//     again, and its start maps that address, deleted from the IPAM. This
//     engine keeps its step 3s out of its starts of VMs with a fixed
//     address (Engine.cacheDrops), a sandbox's own VMs above all, which
//     build side by side; another node's starts it cannot.
//   - The fixed entry names no VM (ipcreate passes no vmid): the VM's
//     address on that network is the IPAM entry of the NIC's MAC
//     (names.go). A VM destroy removes it (QemuServer/Network.pm
//     delete_ifaces_ipams_ips: Vnets.pm del_ips_from_mac finds it by the
//     MAC); whatever is left on a vnet (a create that failed between the
//     steps) goes before its subnet (the client's DeleteSubnet).
//   - A NIC with a fixed address and no MAC gets one of the daemon's:
//     locally administered and random in its other 46 bits (as
//     pve-common's random_ether_addr without a prefix), in upper case as
//     Proxmox writes its own: the MAC is the key of Proxmox's cache, and
//     the configured NIC's MAC, the reservation's and the deletion's must
//     be one string.
//   - A MAC given is used as given (upper-cased): a create that gives one
//     a VM of another of this node's sandboxes has is refused, as Proxmox
//     caches a MAC's address cluster-wide by the MAC alone and two live
//     NICs of one MAC would get each other's mapping (macsFreeLocked).
//   - A request with any NIC's MAC or address fixed is never served by the
//     warm pool: a member's NICs are configured already (pool.go).

// fixedMACs are the MACs a create request fixes, in upper case.
func fixedMACs(req apitype.CreateRequest) map[string]bool {
	want := map[string]bool{}
	for _, v := range req.VMs {
		for _, n := range v.NICs {
			if n.MAC != "" {
				want[strings.ToUpper(n.MAC)] = true
			}
		}
	}
	return want
}

// macsFreeLocked refuses (ErrConflict) a create that fixes a MAC a VM of
// another of this engine's sandboxes has: Proxmox caches a MAC's address
// under the MAC alone, cluster-wide (Ipams.pm add_cache_mac_ip), so two
// live NICs of one MAC in two zones map each other's address (the start's
// get_ips_from_mac gives the last one cached). The refusal names the
// sandbox and its VM only to the sandbox's owner (the API hides other
// owners' sandboxes). Other nodes' sandboxes are macsFreeInCluster's.
// Call with m.mu held.
func (m *Engine) macsFreeLocked(req apitype.CreateRequest) error {
	want := fixedMACs(req)
	if len(want) == 0 {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(m.sbx)) {
		r := m.sbx[id]
		for _, v := range r.VMs {
			for _, n := range v.NICs {
				if !want[strings.ToUpper(n.MAC)] {
					continue
				}
				if r.Owner != req.Owner {
					return refuse(ErrConflict, "mac %s: a VM of another owner's sandbox on this node has it (%s)", strings.ToUpper(n.MAC), macCacheWhy)
				}
				return refuse(ErrConflict, "mac %s: sandbox %s's VM %s has it (%s)", n.MAC, id, v.Name, macCacheWhy)
			}
		}
	}
	return nil
}

// macCacheWhy says why a MAC in use elsewhere is refused.
const macCacheWhy = "Proxmox caches a MAC's address cluster-wide, by the MAC alone"

// macsFreeInCluster refuses (ErrConflict) a create that fixes a MAC that
// Proxmox's IPAM holds an entry of anywhere in the cluster, but for the
// NICs of this engine's sandboxes that fix it (macsFreeLocked's): another
// node's sandbox, or any VM of a zone with the pve IPAM and DHCP. Proxmox
// caches a MAC's address cluster-wide, by the MAC alone (pve-network
// Ipams.pm add_cache_mac_ip, get_ips_from_mac: the cached address is
// taken whatever the zone), and a zone's dnsmasq drops the mapping of a
// MAC whose cached address is another (Dhcp/Dnsmasq.pm add_ip_mapping):
// a second NIC of the MAC would move the first one's mapping, or drop it
// with its delete (Subnets.pm del_ip drops the MAC's cached address,
// whichever it is). Nothing is made before this check: it reads the
// IPAM (GET /cluster/sdn/ipams/pve/status) and refuses with the MAC
// alone, never the other zone (another tenant's). Two nodes' creates of
// one MAC at the same moment may both pass it.
func (m *Engine) macsFreeInCluster(ctx context.Context, req apitype.CreateRequest) error {
	want := fixedMACs(req)
	if len(want) == 0 {
		return nil
	}
	entries, err := m.fixer.MACEntries(ctx, slices.Sorted(maps.Keys(want)))
	if err != nil {
		return pxErr("list the IPAM entries of the fixed MACs", err)
	}
	m.mu.Lock()
	own := map[string]bool{} // "vnet MAC" of this engine's fixed NICs
	for _, r := range m.sbx {
		for _, v := range r.VMs {
			for _, n := range v.NICs {
				for _, net := range r.Networks {
					if n.MAC != "" && net.Name == n.Network {
						own[net.VNet+" "+strings.ToUpper(n.MAC)] = true
					}
				}
			}
		}
	}
	m.mu.Unlock()
	for _, e := range entries {
		mac := strings.ToUpper(e.MAC)
		if !want[mac] || own[e.VNet+" "+mac] {
			continue
		}
		m.log.Info("fixed MAC refused: Proxmox's IPAM has it", "mac", mac, "vnet", e.VNet, "vmid", e.VMID, "ip", e.IP)
		return refuse(ErrConflict, "mac %s: a NIC of the cluster outside this node's sandboxes has it in Proxmox's IPAM (another node's sandbox, or a VM of the cluster; %s)", mac, macCacheWhy)
	}
	return nil
}

// randomMAC is a random, locally administered, unicast MAC in upper case.
func randomMAC() string {
	v := rand.Uint64()
	b := [6]byte{byte(v>>40)&0xfe | 0x02, byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	return fmt.Sprintf("%02X:%02X:%02X:%02X:%02X:%02X", b[0], b[1], b[2], b[3], b[4], b[5])
}

// recordNICs is the NICs of a VM's record from its request: the MACs as
// given (the API upper-cases them), one picked for a NIC with a fixed
// address and none; nil when the request gave networks.
func recordNICs(v apitype.VMRequest) []apitype.NIC {
	if len(v.NICs) == 0 {
		return nil
	}
	out := make([]apitype.NIC, len(v.NICs))
	for j, n := range v.NICs {
		out[j] = n
		if n.IPv4 != "" && n.MAC == "" {
			out[j].MAC = randomMAC()
		}
	}
	return out
}

// fixesNICs reports whether a create asks for any NIC's MAC or address.
func fixesNICs(req apitype.CreateRequest) bool {
	for _, v := range req.VMs {
		for _, n := range v.NICs {
			if n.MAC != "" || n.IPv4 != "" {
				return true
			}
		}
	}
	return false
}

// recordMACs are the MACs of a VM's NICs as its record fixes them, by NIC
// ("" for one Proxmox picks); nil when none is fixed.
func recordMACs(v apitype.VM) []string {
	var out []string
	for j, n := range v.NICs {
		if n.MAC == "" {
			continue
		}
		if out == nil {
			out = make([]string, len(v.NICs))
		}
		out[j] = n.MAC
	}
	return out
}

// fixedNIC is a NIC with a fixed address: the vnet it is on and its MAC.
type fixedNIC struct {
	vnet string
	ip   netip.Addr
	mac  string
}

// fixedNICsLocked lists the NICs of rec's VM i with a fixed address (all
// VMs when i < 0).
func fixedNICsLocked(rec *record, i int) []fixedNIC {
	var out []fixedNIC
	for k, v := range rec.VMs {
		if i >= 0 && k != i {
			continue
		}
		for _, n := range v.NICs {
			if n.IPv4 == "" {
				continue
			}
			for _, net := range rec.Networks {
				if net.Name == n.Network {
					out = append(out, fixedNIC{vnet: net.VNet, ip: netip.MustParseAddr(n.IPv4), mac: n.MAC})
				}
			}
		}
	}
	return out
}

// reserveAddresses adds the IPAM entry of every fixed address of rec for
// its NIC's MAC: after the sandbox's SDN apply, before any of its NICs is
// configured (step 1 above).
func (m *Engine) reserveAddresses(ctx context.Context, rec *record) error {
	m.mu.Lock()
	nics := fixedNICsLocked(rec, -1)
	zone := rec.Zone
	m.mu.Unlock()
	for _, n := range nics {
		if err := m.fixer.ReserveIP(ctx, zone, n.vnet, n.ip, n.mac); err != nil {
			return pxErr(fmt.Sprintf("reserve %s for %s on %s", n.ip, n.mac, n.vnet), err)
		}
	}
	return nil
}

// dropRangeAddresses deletes the IPAM entries the configure of rec's VM i
// gave its NICs of a fixed address from the DHCP range (step 3 above), and
// checks that each fixed address's entry is still the NIC's.
func (m *Engine) dropRangeAddresses(ctx context.Context, rec *record, i int) error {
	m.mu.Lock()
	nics := fixedNICsLocked(rec, i)
	zone := rec.Zone
	m.mu.Unlock()
	if len(nics) == 0 {
		return nil
	}
	var vnets []string
	for _, n := range nics {
		vnets = append(vnets, n.vnet)
	}
	entries, err := m.addrs.IPAMAddresses(ctx, vnets)
	if err != nil {
		return pxErr("list ipam addresses", err)
	}
	if err := m.cacheDrops.Acquire(ctx, cacheDropsAll); err != nil {
		return fmt.Errorf("release the range addresses: waiting for this node's starts of VMs with a fixed address: %w", err)
	}
	defer m.cacheDrops.Release(cacheDropsAll)
	for _, n := range nics {
		kept := false
		for _, e := range entries {
			if e.VNet != n.vnet || !strings.EqualFold(e.MAC, n.mac) {
				continue
			}
			if e.IP == n.ip {
				kept = true
				continue
			}
			if err := m.fixer.ReleaseIP(ctx, zone, n.vnet, e.IP, n.mac); err != nil {
				return pxErr(fmt.Sprintf("release %s of %s on %s", e.IP, n.mac, n.vnet), err)
			}
		}
		if !kept {
			return pxErr("check the reservation of "+n.ip.String(), fmt.Errorf("the IPAM entry of %s for %s on %s is gone", n.ip, n.mac, n.vnet))
		}
	}
	return nil
}

// cacheDropsAll is the weight of Engine.cacheDrops a release of range
// addresses takes: more than any number of concurrent starts.
const cacheDropsAll = 1 << 30
