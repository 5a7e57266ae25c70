package pveemu

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// Config keys by the privilege qemu-server's update_vm checks for them
// (qemu-server PVE/API2/Qemu.pm: $cpuoptions, $memoryoptions,
// $hwtypeoptions, $generaloptions, $vmpoweroptions, $diskoptions,
// $cloudinitoptions).
var configKeyPriv = func() map[string]string {
	m := map[string]string{}
	add := func(priv string, keys ...string) {
		for _, k := range keys {
			m[k] = priv
		}
	}
	add("VM.Config.CPU", "cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus")
	add("VM.Config.Memory", "memory", "balloon", "shares", "allow-ksm")
	add("VM.Config.HWType", "acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga", "watchdog", "audio0", "rng0")
	add("VM.Config.Options", "agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime", "migrate_speed",
		"name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf", "template")
	add("VM.PowerMgmt", "freeze")
	add("VM.Config.Disk", "boot", "bootdisk", "vmstatestorage")
	return m
}()

var (
	reCloudinitKey = regexp.MustCompile(`^(cicustom|cipassword|citype|ciuser|ciupgrade|nameserver|searchdomain|sshkeys|ipconfig\d+)$`)
	// reValueCheckedKey are the keys check_vm_modify_config_perm skips:
	// their privilege depends on the value (checked by the update itself).
	reValueCheckedKey = regexp.MustCompile(`^(cdrom|tags|(unused|serial|usb|hostpci|virtiofs)\d+)$`)
)

// vmPermLocked is RPCEnvironment check_vm_perm without a pool: privs
// (all, or with anyOf one of them) on /vms/VMID.
func (s *Server) vmPermLocked(authid string, vmid int, privs []string, anyOf bool) error {
	path := fmt.Sprintf("/vms/%d", vmid)
	return s.privsCheck(authid, path, s.privilegesLocked(authid, path), privs, anyOf)
}

// checkModifyConfigPermLocked is qemu-server's check_vm_modify_config_perm
// for the keys an update sets or deletes: the privilege of each key's
// class on the VM. Drives and the value-dependent keys are skipped (see
// checkConfigValuePermsLocked); an unknown key is root's alone.
func (s *Server) checkModifyConfigPermLocked(authid string, vmid int, keys []string) error {
	if authid == "root@pam" {
		return nil
	}
	for _, k := range keys {
		if reDiskKey.MatchString(k) || reValueCheckedKey.MatchString(k) {
			continue
		}
		var err error
		switch priv, ok := configKeyPriv[k]; {
		case ok:
			err = s.vmPermLocked(authid, vmid, []string{priv}, false)
			if err == nil && k == "startup" {
				err = s.checkPrivsLocked(authid, "/", []string{"Sys.Modify"})
			}
		case strings.HasPrefix(k, "numa") && k != "numa":
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.CPU"}, false)
		case reNetKey.MatchString(k) || k == "running-nets-host-mtu":
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.Network"}, false)
		case reCloudinitKey.MatchString(k):
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.Cloudinit", "VM.Config.Network"}, true)
		case k == "vmstate":
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.Disk", "VM.PowerMgmt"}, false)
		default:
			err = fail("only root can set '%s' config", k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// drivePerm is update_vm's $check_drive_perms: a cloud-init drive needs
// VM.Config.Cloudinit and VM.Config.CDROM, a CD-ROM VM.Config.CDROM, any
// other drive VM.Config.Disk.
func (s *Server) drivePermLocked(authid string, vmid int, val string) error {
	switch {
	case strings.Contains(val, "cloudinit"):
		return s.vmPermLocked(authid, vmid, []string{"VM.Config.Cloudinit", "VM.Config.CDROM"}, false)
	case strings.Contains(val, "media=cdrom") || strings.HasPrefix(val, "cdrom") || strings.HasPrefix(val, "none,media"):
		return s.vmPermLocked(authid, vmid, []string{"VM.Config.CDROM"}, false)
	}
	return s.vmPermLocked(authid, vmid, []string{"VM.Config.Disk"}, false)
}

// checkConfigValuePermsLocked is what update_vm's worker checks per key
// with the values at hand: for each deletion the drive's kind, a socket
// serial port's VM.Config.HWType, a spice USB port's VM.Config.HWType
// (check_usb_perm), an unused disk's VM.Config.Disk, a NIC's bridge
// (check_bridge_access on the value deleted), the tags' (tagPermLocked);
// for each drive set, the old and the new value's kind; for each NIC set
// over one in the config, the old NIC's bridge; tags set, the tags'. A
// deletion checks the current value, else the pending one
// ($conf->{$opt} // $conf->{pending}->{$opt}). Values root alone may set
// are refused before (checkRootOnlyConfig).
func (s *Server) checkConfigValuePermsLocked(authid string, vmid int, set map[string]string, del []string, conf, pending map[string]string) error {
	if authid == "root@pam" {
		return nil
	}
	for _, k := range del {
		val, ok := conf[k]
		if !ok {
			val, ok = pending[k]
		}
		if !ok {
			continue // "cannot delete ... not set": a warning only
		}
		var err error
		switch {
		case strings.HasPrefix(k, "unused"):
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.Disk"}, false)
		case reDiskKey.MatchString(k):
			err = s.drivePermLocked(authid, vmid, val)
		case reSerialKey.MatchString(k), strings.HasPrefix(k, "usb"), strings.HasPrefix(k, "rng"):
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.HWType"}, false)
		case reNetKey.MatchString(k):
			err = s.checkBridgeAccessLocked(authid, map[string]string{k: val})
		case k == "tags":
			err = s.tagPermLocked(authid, vmid)
		}
		if err != nil {
			return err
		}
	}
	for _, k := range sortedKeys(set) {
		var err error
		switch {
		case reNetKey.MatchString(k):
			if old := conf[k]; old != "" {
				err = s.checkBridgeAccessLocked(authid, map[string]string{k: old})
			}
		case k == "tags":
			err = s.tagPermLocked(authid, vmid)
		case reDiskKey.MatchString(k):
			if old, ok := conf[k]; ok {
				if err := s.drivePermLocked(authid, vmid, old); err != nil {
					return err
				}
			}
			err = s.drivePermLocked(authid, vmid, set[k])
		case reSerialKey.MatchString(k), strings.HasPrefix(k, "usb"):
			err = s.vmPermLocked(authid, vmid, []string{"VM.Config.HWType"}, false)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// tagPermLocked is pve-guest-common's assert_tag_permissions with the
// datacenter's defaults (user-tag-access "free", no registered tags):
// VM.Config.Options on the VM, and any tag is allowed.
func (s *Server) tagPermLocked(authid string, vmid int) error {
	return s.vmPermLocked(authid, vmid, []string{"VM.Config.Options"}, false)
}

// checkBridgeAccessLocked is qemu-server's check_bridge_access with
// pve-guest-common's check_vnet_access: SDN.Use on
// /sdn/zones/ZONE/BRIDGE, or on .../TAG for a NIC's VLAN tag and each VLAN
// of its trunks instead, for the bridge of every NIC in conf, ZONE being
// the vnet's zone in vnets.cfg (the pending generation:
// PVE::Network::SDN::Vnets::config) or "localnetwork" for a host bridge
// (access.NICPaths).
func (s *Server) checkBridgeAccessLocked(authid string, conf map[string]string) error {
	if authid == "root@pam" {
		return nil
	}
	for _, path := range access.NICPaths(conf, s.vnetZoneLocked) {
		if err := s.checkPrivsLocked(authid, path, []string{"SDN.Use"}); err != nil {
			return err
		}
	}
	return nil
}

// checkUpdateRequestLocked is what update_vm_api checks of the request
// before it loads the config (and before the asynchronous POST forks its
// worker): check_vm_modify_config_perm of the keys deleted, then of the
// keys set, then check_bridge_access of the NICs set. The checks that need
// the config's values (checkConfigValuePermsLocked) are the worker's.
func (s *Server) checkUpdateRequestLocked(u *configUpdate) error {
	if err := s.checkModifyConfigPermLocked(u.authid, u.vmid, u.deletes); err != nil {
		return err
	}
	if err := s.checkModifyConfigPermLocked(u.authid, u.vmid, sortedKeys(u.changes)); err != nil {
		return err
	}
	return s.checkBridgeAccessLocked(u.authid, u.changes)
}
