// Package firewall builds and keeps in force the host guard: one nftables
// table, inet pve-inspect, owned by the daemon (table flags owner|persist),
// that confines guests (DESIGN.md section 3).
package firewall
