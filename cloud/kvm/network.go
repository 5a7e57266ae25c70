package kvm

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// checkNetwork accepts the owned network (present or not) and any network
// libvirt has.
func (m *Manager) checkNetwork(name string) error {
	if name == m.cfg.Network {
		return nil
	}
	_, err := m.conn.NetworkLookupByName(name)
	if isCode(err, libvirt.ErrNoNetwork) {
		return fmt.Errorf("network %q (see virsh net-list --all; leave --network out to use %s, created when missing): %w", name, m.cfg.Network, ErrUnknownNetwork)
	}
	if err != nil {
		return fmt.Errorf("network %s: %w", name, err)
	}
	return nil
}

// ensureNetwork returns the network, creating the owned one when missing
// and starting it when inactive.
func (m *Manager) ensureNetwork(u *undo, name string) (libvirt.Network, error) {
	n, err := m.conn.NetworkLookupByName(name)
	switch {
	case isCode(err, libvirt.ErrNoNetwork) && name == m.cfg.Network:
		nx, err := NetworkSpec{Name: name, Bridge: m.cfg.Bridge, Subnet: m.cfg.Subnet}.Network()
		if err != nil {
			return n, err
		}
		x, err := nx.Marshal()
		if err != nil {
			return n, err
		}
		if n, err = m.conn.NetworkDefineXML(x); err != nil {
			return n, fmt.Errorf("define network %s: %w", name, err)
		}
		u.push(func() error { return m.conn.NetworkUndefine(n) })
		if err := m.conn.NetworkSetAutostart(n, 1); err != nil {
			return n, fmt.Errorf("network %s: autostart: %w", name, err)
		}
		m.log.Info("network created", "network", name, "subnet", m.cfg.Subnet)
	case isCode(err, libvirt.ErrNoNetwork):
		return n, fmt.Errorf("network %q: %w", name, ErrUnknownNetwork)
	case err != nil:
		return n, fmt.Errorf("network %s: %w", name, err)
	}
	if active, err := m.conn.NetworkIsActive(n); err != nil {
		return n, fmt.Errorf("network %s: %w", name, err)
	} else if active == 0 {
		if err := m.conn.NetworkCreate(n); err != nil {
			return n, fmt.Errorf("start network %s: %w", name, err)
		}
		u.push(func() error { return m.conn.NetworkDestroy(n) })
	}
	return n, nil
}

// reserve picks the lowest free address of the network's reserved range
// and adds a DHCP host entry for mac, live and in the saved config.
func (m *Manager) reserve(u *undo, netName, host, mac string) (netip.Addr, error) {
	n, err := m.ensureNetwork(u, netName)
	if err != nil {
		return netip.Addr{}, err
	}
	nx, err := m.networkXML(n)
	if err != nil {
		return netip.Addr{}, err
	}
	addr, err := freeAddress(nx)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network %s: %w", netName, err)
	}
	h := libvirtxml.NetworkDHCPHost{MAC: mac, Name: host, IP: addr.String()}
	if err := m.updateHost(n, libvirt.NetworkUpdateCommandAddLast, h); err != nil {
		return netip.Addr{}, fmt.Errorf("network %s: reserve %s: %w", netName, addr, err)
	}
	u.push(func() error { return m.updateHost(n, libvirt.NetworkUpdateCommandDelete, h) })
	return addr, nil
}

func (m *Manager) networkXML(n libvirt.Network) (*libvirtxml.Network, error) {
	x, err := m.conn.NetworkGetXMLDesc(n, 0)
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", n.Name, err)
	}
	var nx libvirtxml.Network
	if err := nx.Unmarshal(x); err != nil {
		return nil, fmt.Errorf("network %s: %w", n.Name, err)
	}
	return &nx, nil
}

func (m *Manager) updateHost(n libvirt.Network, cmd libvirt.NetworkUpdateCommand, h libvirtxml.NetworkDHCPHost) error {
	x, err := h.Marshal()
	if err != nil {
		return err
	}
	flags := libvirt.NetworkUpdateAffectConfig
	if active, err := m.conn.NetworkIsActive(n); err == nil && active == 1 {
		flags |= libvirt.NetworkUpdateAffectLive
	}
	return m.conn.NetworkUpdateCompat(n, cmd, libvirt.NetworkSectionIPDhcpHost, -1, x, flags)
}

// freeAddress finds the network's DHCP subnet and the lowest address of its
// reserved range no host entry uses.
func freeAddress(nx *libvirtxml.Network) (netip.Addr, error) {
	for _, ip := range nx.IPs {
		if ip.DHCP == nil || (ip.Family != "" && ip.Family != "ipv4") {
			continue
		}
		gw, err := netip.ParseAddr(ip.Address)
		if err != nil || !gw.Is4() {
			continue
		}
		bits := int(ip.Prefix)
		if ip.Netmask != "" {
			mk, err := netip.ParseAddr(ip.Netmask)
			if err != nil || !mk.Is4() {
				continue
			}
			bits = 32 - trailingZeros(addrU32(mk))
		}
		p, err := gw.Prefix(bits)
		if err != nil || bits < 16 || bits > 28 {
			return netip.Addr{}, fmt.Errorf("subnet %s/%d: %w", gw, bits, ErrSubnet)
		}
		used := map[netip.Addr]bool{gw: true}
		for _, h := range ip.DHCP.Hosts {
			if a, err := netip.ParseAddr(h.IP); err == nil {
				used[a] = true
			}
		}
		first, last := reservedRange(p)
		for a := first; a.Compare(last) <= 0; a = a.Next() {
			if !used[a] {
				return a, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("no free address left in %s-%s", first, last)
	}
	return netip.Addr{}, errors.New("no IPv4 subnet with DHCP: nodes need a DHCP reservation")
}

func trailingZeros(v uint32) int {
	n := 0
	for n < 32 && v&(1<<n) == 0 {
		n++
	}
	return n
}
