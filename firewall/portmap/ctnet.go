package portmap

import "fmt"

// ParseCTNet parses the value of a container's config key netN in
// pve-container's net format ("name=eth0,bridge=vnet1,hwaddr=BC:24:11:..,
// ip=dhcp,type=veth,firewall=1": src/PVE/LXC/Config.pm $netconf_desc,
// every property key=value). Only hwaddr, bridge and firewall matter to
// the guard; other properties are ignored, a part without a value is an
// error, a type other than veth is an error (pve-container has no
// other), and a NIC without a MAC is an error (the guard cannot pin it).
// The NIC has no model.
func ParseCTNet(key, value string) (NIC, error) {
	return parseNIC(key, value, func(n *NIC, k, v string) error {
		switch k {
		case "hwaddr":
			mac, err := parseMAC(v)
			if err != nil {
				return err
			}
			n.MAC = mac
		case "type":
			if v != "veth" {
				return fmt.Errorf("type %q, want veth (pve-container's only type)", v)
			}
		}
		return nil
	}, nil)
}
