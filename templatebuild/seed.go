package templatebuild

import (
	"fmt"
	"regexp"
	"strings"
)

// rePackage is a Debian package name (Debian policy 5.6.1), which is what
// goes unquoted into the user-data.
var rePackage = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// userData is the cloud-config of the first boot: the packages (the guest
// agent first), the agent started, and systemd-networkd-wait-online masked
// (it holds boots for minutes on a NIC without DHCP, as the reference
// plugin notes).
func userData(packages []string) (string, error) {
	var b strings.Builder
	b.WriteString("#cloud-config\n# written by pve-inspectd template build\npackage_update: true\npackages:\n  - qemu-guest-agent\n")
	for _, p := range packages {
		if !rePackage.MatchString(p) {
			return "", fmt.Errorf("package %q: not a Debian package name", p)
		}
		if p != "qemu-guest-agent" {
			fmt.Fprintf(&b, "  - %s\n", p)
		}
	}
	b.WriteString("runcmd:\n  - [systemctl, enable, qemu-guest-agent]\n  - [systemctl, start, qemu-guest-agent]\n  - [systemctl, mask, systemd-networkd-wait-online.service]\n")
	return b.String(), nil
}

// networkConfig takes DHCPv4 on every NIC named e* (matched by name, not
// MAC, so that clones with new MACs come up too) and no IPv6.
const networkConfig = `network:
  version: 2
  ethernets:
    default:
      match:
        name: "e*"
      dhcp4: true
      dhcp6: false
`

// snippetNames are the user-data and network-config snippet files of the
// build of template name.
func snippetNames(name string) (user, network string) {
	return "pvei-build-" + name + "-user.yaml", "pvei-build-" + name + "-network.yaml"
}
