// Package legacy takes a node over from the reference provisioning scripts
// (the bash heredocs pve-inspectd replaces): it stops and disables their
// units, removes the iptables rules they installed and puts back the
// resolver file their lockdown blanked, so that pve-inspectd's own guard
// and lockdown are the only ones in force. The lockdown marker
// (/etc/inspect-proxmox-egress-lockdown) is shared and left as it is.
//
// The reference rules are matched exactly: the lockdown's mangle rules by
// their comment ("inspect-proxmox-egress-lockdown <run id>"), and the
// metadata block's three uncommented rules by their full specification
// (raw PREROUTING -d 169.254.0.0/16 -j DROP, FORWARD -s 169.254.0.0/16 -j
// DROP, ip6tables FORWARD -j DROP). Nothing else is touched.
package legacy
