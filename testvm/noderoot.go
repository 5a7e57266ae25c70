package testvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// NodeRoot is a directory tree with the node's files in Proxmox's layout,
// for code that reads them through a configurable root (the layer-2
// guard's port map): etc/pve/qemu-server/<vmid>.conf of every running
// guest and etc/pve/lxc/<vmid>.conf of every running container (their
// net0 with MAC and vnet), and var/lib/misc/dnsmasq.<zone>.leases, links
// to the zones' real dnsmasq lease files.
func (b *Bed) NodeRoot() string { return filepath.Join(b.dir, "noderoot") }

func (b *Bed) vmConfPath(vmid int) string {
	return filepath.Join(b.NodeRoot(), "etc", "pve", "qemu-server", strconv.Itoa(vmid)+".conf")
}

// writeVMConf writes a guest's VM configuration (the keys the node's
// readers use) the way pmxcfs shows it.
func (b *Bed) writeVMConf(g *Guest) error {
	p := b.vmConfPath(g.VMID)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	agent := "1"
	if g.Socket == "" {
		agent = "0" // started without an agent (GuestSpec.NoAgent)
	}
	conf := fmt.Sprintf("agent: %s\nname: vm%d\n", agent, g.VMID)
	if g.VNet != "" {
		fw := ""
		if g.Firewall {
			fw = ",firewall=1" // qemu-server's net format; portmap then maps fwpr<vmid>p0 too
		}
		conf += fmt.Sprintf("net0: virtio=%s,bridge=%s%s\n", strings.ToUpper(g.MAC.String()), g.VNet, fw)
	}
	return os.WriteFile(p, []byte(conf), 0o644)
}

func (b *Bed) ctConfPath(vmid int) string {
	return filepath.Join(b.NodeRoot(), "etc", "pve", "lxc", strconv.Itoa(vmid)+".conf")
}

// writeCTConf writes a container's configuration (the keys the node's
// readers use) the way pmxcfs shows pve-container's: net0 in its net
// format (src/PVE/LXC/Config.pm print_lxc_network: name first).
func (b *Bed) writeCTConf(c *Container, s ContainerSpec) error {
	p := b.ctConfPath(c.VMID)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	conf := "arch: amd64\n"
	if s.Hostname != "" {
		conf += "hostname: " + s.Hostname + "\n"
	}
	if n := s.Net; n != nil {
		ip := ""
		if n.IP != "" {
			ip = ",ip=" + n.IP
		}
		conf += fmt.Sprintf("net0: name=%s,bridge=%s,hwaddr=%s%s,type=veth\n", n.Name, n.Bridge, strings.ToUpper(n.MAC.String()), ip)
	}
	var features []string
	if s.Features.Keyctl {
		features = append(features, "keyctl=1")
	}
	if s.Features.Nesting {
		features = append(features, "nesting=1")
	}
	if len(features) > 0 {
		conf += "features: " + strings.Join(features, ",") + "\n"
	}
	for _, m := range s.IDMap {
		conf += "lxc.idmap: " + m + "\n"
	}
	conf += "ostype: debian\nunprivileged: 1\n"
	return os.WriteFile(p, []byte(conf), 0o644)
}

// linkLeases links the zone's lease file where Proxmox's dnsmasq keeps it.
func (b *Bed) linkLeases(zone string) error {
	d := filepath.Join(b.NodeRoot(), "var", "lib", "misc")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	link := filepath.Join(d, "dnsmasq."+zone+".leases")
	_ = os.Remove(link)
	return os.Symlink(b.leaseFile(zone), link)
}
