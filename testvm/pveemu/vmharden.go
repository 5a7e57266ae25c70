package pveemu

import (
	"regexp"
	"slices"
	"strings"
)

// The VM settings of the hardened sandbox profile (issue 17) that
// qemu-server treats specially: the VM-specific CPU configuration and the
// config keys only root@pam may set or delete. Sources in FIDELITY.md.

// vmCPUFlags are the flags a VM config may carry (qemu-server
// PVE/QemuServer/CPUFlags.pm, x86_64 VM-specific flags); everything else
// needs a custom CPU model.
var vmCPUFlags = []string{"aes", "amd-no-ssb", "amd-ssbd", "hv-evmcs", "hv-tlbflush", "ibpb",
	"md-clear", "nested-virt", "pcid", "pdpe1gb", "spec-ctrl", "ssbd", "virt-ssbd"}

// vmCPUModels are the CPU types the emulator knows: the Proxmox built-in
// x86-64-v* models (PVE/QemuServer/CPUConfig.pm $builtin_models) and a
// subset of QEMU's (the real list comes from pve-qemu's cpu-models file).
var vmCPUModels = []string{"x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4",
	"host", "max", "kvm64", "qemu64", "kvm32", "qemu32"}

var reCPUFlag = regexp.MustCompile(`^[+-][a-zA-Z0-9\-_.]+$`)

var vmCPUFormat = map[string]*Prop{
	"cputype":         {Type: "string", DefaultKey: true, Optional: true},
	"flags":           {Type: "string", Optional: true},
	"guest-phys-bits": {Type: "integer", Optional: true},
	"hidden":          {Type: "boolean", Optional: true},
	"hv-vendor-id":    {Type: "string", Optional: true},
	"phys-bits":       {Type: "string", Optional: true},
	"reported-model":  {Type: "string", Optional: true},
}

func init() {
	namedFormats["pve-vm-cpu-conf"] = checkVMCPUConf
}

// checkVMCPUConf is validate_vm_cpu_conf: a known cputype, VM-specific
// flags only, no reported-model.
func checkVMCPUConf(v string) error {
	if err := parsePropertyString(vmCPUFormat, v, "cpu"); err != nil {
		return err
	}
	props := map[string]string{}
	for i, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok && i == 0 {
			k, val = "cputype", part
		}
		props[k] = val
	}
	typ := props["cputype"]
	if typ == "" {
		return formatErr("CPU is missing cputype")
	}
	if strings.HasPrefix(typ, "custom-") {
		return formatErr("Custom cputype '%s' not found", strings.TrimPrefix(typ, "custom-"))
	}
	if !slices.Contains(vmCPUModels, typ) {
		return formatErr("Built-in cputype '%s' is not defined (missing 'custom-' prefix?)", typ)
	}
	if f, ok := props["flags"]; ok {
		for _, flag := range strings.Split(f, ";") {
			if !reCPUFlag.MatchString(flag) {
				return formatErr("value does not match the regex pattern")
			}
			if !slices.Contains(vmCPUFlags, flag[1:]) {
				return formatErr("VM-specific CPU flags must be a subset of: %s", strings.Join(vmCPUFlags, ", "))
			}
		}
	}
	if _, ok := props["reported-model"]; ok {
		return formatErr("Property 'reported-model' not allowed in VM-specific CPU config.")
	}
	return nil
}

var (
	reRootOnlyKey = regexp.MustCompile(`^(args|hookscript|ivshmem|parallel\d+|lock|affinity)$`)
	reSerialKey   = regexp.MustCompile(`^serial\d+$`)
	reDeviceKey   = regexp.MustCompile(`^(usb|hostpci|virtiofs)\d+$`)
)

// checkRootOnlyConfig refuses, for anyone but root@pam, setting or
// deleting the config keys qemu-server reserves to root
// (check_vm_modify_config_perm's catch-all, the serial, usb and hostpci
// checks). Device mappings (Mapping.Use) are not emulated: a mapped
// device counts as root-only here.
func checkRootOnlyConfig(authid string, set map[string]string, del []string, old map[string]string) error {
	if authid == "root@pam" {
		return nil
	}
	check := func(key, value string, deleting bool) error {
		verb := "set"
		if deleting {
			verb = "delete"
		}
		switch {
		case reRootOnlyKey.MatchString(key):
			return fail("only root can set '%s' config", key)
		case reSerialKey.MatchString(key) && value != "socket":
			return fail("only root can %s '%s' config for real devices", verb, key)
		case reDeviceKey.MatchString(key):
			if strings.HasPrefix(key, "usb") && (value == "spice" || value == "host=spice") {
				return nil
			}
			if strings.HasPrefix(key, "hostpci") {
				return fail("only root can set '%s' config for non-mapped devices", key)
			}
			return fail("only root can set '%s' config for real devices", key)
		}
		return nil
	}
	for _, k := range sortedKeys(set) {
		if err := check(k, set[k], false); err != nil {
			return err
		}
	}
	for _, k := range del {
		if err := check(k, old[k], true); err != nil {
			return err
		}
	}
	return nil
}
