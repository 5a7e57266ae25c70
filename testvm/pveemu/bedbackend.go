package pveemu

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// BedBackend runs the emulator's zones and guests on a testvm.Bed: SDN
// apply creates the bed's bridges, gateway addresses, SNAT and per-zone
// dnsmasq; VM start creates the guest namespace with its real qemu-ga on
// <QGADir>/<vmid>.qga; a VM's disk directory is the guest's overlay.
type BedBackend struct {
	Bed *testvm.Bed
}

// ApplyZone implements Backend. A zone already running is changed in
// place (testvm.Bed.ApplyZone: its guests stay attached and its DHCP host
// mappings and leases stay, as on a node). The bed builds a vnet from its address plan, so a vnet without a subnet (a
// sandbox half built while another one applies) is left out, and a zone
// left without vnets has nothing on the bed; a real node applies both
// without error (bridges without addresses).
func (b BedBackend) ApplyZone(ctx context.Context, z ZoneSpec) error {
	zone := testvm.Zone{ID: z.ID}
	for _, v := range z.VNets {
		if !v.Subnet.IsValid() {
			continue
		}
		tv := testvm.VNet{Name: v.Name, Subnet: v.Subnet, Gateway: v.Gateway, SNAT: v.SNAT, StaticDHCP: v.StaticDHCP}
		for _, r := range v.DHCP {
			tv.DHCP = append(tv.DHCP, testvm.DHCPRange{Start: r.Start, End: r.End})
		}
		zone.VNets = append(zone.VNets, tv)
	}
	if len(zone.VNets) == 0 {
		return b.RemoveZone(ctx, z.ID)
	}
	return b.Bed.ApplyZone(ctx, zone)
}

// RemoveZone implements Backend.
func (b BedBackend) RemoveZone(ctx context.Context, id string) error {
	if err := b.Bed.RemoveZone(ctx, id); err != nil && !strings.Contains(err.Error(), "does not exist") {
		return err
	}
	return nil
}

// StartVM implements Backend.
func (b BedBackend) StartVM(ctx context.Context, v VMSpec) error {
	_, err := b.Bed.StartGuest(ctx, testvm.GuestSpec{VMID: v.VMID, VNet: v.VNet, MAC: v.MAC, IP: v.IP, Disk: v.Disk, MemoryMiB: v.MemoryMiB, CPUs: v.CPUs,
		NoAgent: v.NoAgent})
	return err
}

// HasBridge implements BridgeReporter: the bed runs a zone with the vnet.
func (b BedBackend) HasBridge(name string) bool { return b.Bed.HasVNet(name) }

// RestartDHCP implements DHCPRestarter: every zone's dnsmasq on the bed is
// stopped, then started again.
func (b BedBackend) RestartDHCP(ctx context.Context) error {
	return b.Bed.RestartDnsmasq(ctx)
}

// StopVM implements Backend.
func (b BedBackend) StopVM(ctx context.Context, vmid int) error {
	if err := b.Bed.StopGuest(ctx, vmid); err != nil && !strings.Contains(err.Error(), "is not running") {
		return err
	}
	return nil
}

// AgentSocket implements Backend.
func (b BedBackend) AgentSocket(vmid int) string {
	return filepath.Join(b.Bed.QGADir(), strconv.Itoa(vmid)+".qga")
}

// SetAgentFrozen implements AgentFreezer: the proxy the bed puts in front
// of the guest's qemu-ga answers as qemu-ga does while frozen; no file
// system is frozen (testvm.Bed.SetAgentFrozen).
func (b BedBackend) SetAgentFrozen(vmid int, frozen bool) error {
	return b.Bed.SetAgentFrozen(vmid, frozen)
}

// StartContainer implements ContainerBackend: an unprivileged LXC
// container on the bed (testvm.Bed.StartContainer), its root an overlay
// of the template's root under the CT's volume.
func (b BedBackend) StartContainer(ctx context.Context, c CTSpec) (int, error) {
	spec := testvm.ContainerSpec{VMID: c.VMID, Hostname: c.Hostname, Rootfs: c.Rootfs, Disk: c.Disk,
		MemoryMiB: c.MemoryMiB, CPUs: c.CPUs}
	if n := c.Net; n != nil {
		spec.Net = &testvm.ContainerNet{Name: n.Name, Bridge: n.Bridge, MAC: n.MAC, IP: n.IP, Gateway: n.Gateway, DHCPIP: n.DHCPIP}
	}
	ct, err := b.Bed.StartContainer(ctx, spec)
	if err != nil {
		return 0, err
	}
	return ct.PID, nil
}

// StopContainer implements ContainerBackend.
func (b BedBackend) StopContainer(ctx context.Context, vmid int) error {
	if err := b.Bed.StopContainer(ctx, vmid); err != nil && !strings.Contains(err.Error(), "is not running") {
		return err
	}
	return nil
}

// ShutdownContainer implements ContainerBackend.
func (b BedBackend) ShutdownContainer(ctx context.Context, vmid int, timeout time.Duration, force bool) error {
	if err := b.Bed.ShutdownContainer(ctx, vmid, timeout, force); err != nil && !strings.Contains(err.Error(), "is not running") {
		return err
	}
	return nil
}

// ContainerPID implements ContainerBackend.
func (b BedBackend) ContainerPID(vmid int) (int, bool) {
	ct, ok := b.Bed.Container(vmid)
	if !ok || !ct.Alive() {
		return 0, false
	}
	return ct.PID, true
}

// AttachDisk implements BlockBackend: the image becomes a block device in
// the guest (testvm.Bed.AttachBlock) named like the guest kernel would name
// the slot (scsiN: sd<letter>, virtioN: vd<letter>), with the by-id link
// byID.
func (b BedBackend) AttachDisk(ctx context.Context, vmid int, slot, image, byID string) error {
	name, err := blockName(slot)
	if err != nil {
		return err
	}
	return b.Bed.AttachBlock(ctx, vmid, image, name, byID)
}

// DetachDisk implements BlockBackend.
func (b BedBackend) DetachDisk(ctx context.Context, vmid int, slot string) error {
	name, err := blockName(slot)
	if err != nil {
		return err
	}
	return b.Bed.DetachBlock(ctx, vmid, name)
}

// blockName maps a slot to the guest's device name. Guess (no QEMU in the
// bed): scsiN is sd<letter>, virtioN vd<letter>; slots past 25 are refused.
// A CD-ROM medium comes as its device name srN (cdromDevice).
var reSrName = regexp.MustCompile(`^sr[0-9]$`)

func blockName(slot string) (string, error) {
	var prefix, num string
	switch {
	case reSrName.MatchString(slot):
		return slot, nil
	case strings.HasPrefix(slot, "scsi"):
		prefix, num = "sd", strings.TrimPrefix(slot, "scsi")
	case strings.HasPrefix(slot, "virtio"):
		prefix, num = "vd", strings.TrimPrefix(slot, "virtio")
	default:
		return "", fmt.Errorf("emulator: cannot hot-plug %s (scsiN and virtioN only)", slot)
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > 25 {
		return "", fmt.Errorf("emulator: cannot hot-plug %s", slot)
	}
	return prefix + string(rune('a'+n)), nil
}

// DialContext implements NodeDialer: a connection opened in the bed's
// node namespace, as the node's wget would open it.
func (b BedBackend) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := b.Bed.Do(b.Bed.NodeNS(), func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// FreezeContainer implements CTFreezer (testvm.Bed.FreezeContainer).
func (b BedBackend) FreezeContainer(ctx context.Context, vmid int) error {
	return b.Bed.FreezeContainer(ctx, vmid)
}

// ThawContainer implements CTFreezer (testvm.Bed.ThawContainer).
func (b BedBackend) ThawContainer(ctx context.Context, vmid int) error {
	return b.Bed.ThawContainer(ctx, vmid)
}
