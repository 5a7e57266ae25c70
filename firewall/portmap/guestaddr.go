package portmap

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// GuestAddrs returns the IPv4 addresses zone's DHCP server gave (leases
// unexpired at now, and static mappings) to the MACs of guest vmid's NICs,
// as the node's files hold them: the MACs from the guest's configuration
// (etc/pve/qemu-server/<vmid>.conf, or a container's
// etc/pve/lxc/<vmid>.conf; written by the node, not the guest),
// the addresses from the zone's files (ReadZone). These are the addresses
// the guard pins to the VM's ports (Ports), so they are the guest's own
// whatever it says of itself. A missing lease is no address, not an
// error.
func (p Paths) GuestAddrs(vmid int, zone string, now time.Time) ([]netip.Addr, error) {
	parse := ParseConfig
	b, err := readBounded(p.path("etc", "pve", "qemu-server", strconv.Itoa(vmid)+".conf"))
	if errors.Is(err, fs.ErrNotExist) {
		// not a VM: a container's (pmxcfs keeps one VMID space)
		parse = ParseCTConfig
		b, err = readBounded(p.path("etc", "pve", "lxc", strconv.Itoa(vmid)+".conf"))
	}
	if err != nil {
		return nil, fmt.Errorf("VM %d: %w", vmid, err)
	}
	nics, _, err := parse(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("VM %d: %w", vmid, err)
	}
	leases, _, err := p.ReadZone(zone)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, l := range leases {
		if !l.Expiry.IsZero() && !l.Expiry.After(now) {
			continue
		}
		for _, n := range nics {
			if bytes.Equal(n.MAC, l.MAC) && !slices.Contains(out, l.IP) {
				out = append(out, l.IP)
			}
		}
	}
	return out, nil
}
