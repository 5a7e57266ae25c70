package pveemu

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ctConfigValue renders a CT config value as load_config returns it:
// pve-container's parse_pct_config passes every value through check_type,
// which makes integers and booleans numbers (memory is an integer here,
// unlike qemu-server's property string) and cpulimit a number.
func ctConfigValue(k, v string) any {
	switch k {
	case "memory", "swap", "cores", "cpuunits", "tty", "onboot", "protection", "template", "unprivileged", "console", "debug", "snaptime":
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	case "cpulimit":
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	}
	return v
}

// ctRestrictedRead are the keys GET config shows only with a privilege
// (LXC.pm $options_with_restricted_read, delete_read_restricted_options).
var ctRestrictedRead = map[string]string{"env": "VM.Config.Options"}

// getCTConfig is GET .../lxc/{vmid}/config (API2/LXC/Config.pm
// vm_config): load_current_config (pending values taken in unless
// current), or with snapshot that snapshot's section
// (AbstractConfig load_snapshot_config: its config, snaptime,
// description, parent, an unfinished one's snapstate), with the digest
// of the config and the read-restricted keys the caller may not see
// removed.
func (s *Server) getCTConfig(_ context.Context, rq *request) (any, error) {
	if rq.has("snapshot") && rq.bool("current", false) {
		msg := "cannot use 'snapshot' parameter with 'current'"
		return nil, paramFail(ParamErrors{"snapshot": msg, "current": msg})
	}
	var out map[string]any
	err := s.openGuest(kindLXC, rq, nil, func(v *vm) error {
		conf := v.conf
		switch sn := rq.str("snapshot"); {
		case sn != "":
			snap := v.snaps[sn]
			if snap == nil {
				return fail("snapshot '%s' does not exist", sn)
			}
			conf = snapshotSection(snap)
		case !rq.bool("current", false):
			conf = withPending(v)
		}
		out = map[string]any{"digest": confDigest(v.conf)}
		for k, val := range conf {
			if priv, ok := ctRestrictedRead[k]; ok && !s.privilegesLocked(rq.authid, fmt.Sprintf("/vms/%d", v.vmid))[priv] {
				continue
			}
			out[k] = ctConfigValue(k, val)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ctFastplug are the options a running CT takes at once (LXC/Config.pm
// $LXC_FASTPLUG_OPTIONS); memory, swap, cpulimit and cpuunits are
// hot-plugged into its cgroup (vmconfig_hotplug_pending; the emulator
// changes no cgroup), the rest waits in pending for the next start.
var ctFastplug = map[string]bool{"description": true, "onboot": true, "startup": true, "protection": true,
	"hostname": true, "hookscript": true, "cores": true, "tags": true, "lock": true,
	"memory": true, "swap": true, "cpulimit": true, "cpuunits": true}

var (
	reMPKey  = regexp.MustCompile(`^mp\d+$`)
	reDevKey = regexp.MustCompile(`^dev\d+$`)
)

// ctRequired are the options update_pct_config will not delete.
var ctRequired = map[string]bool{"memory": true, "rootfs": true, "ostype": true}

// putCTConfig is PUT .../lxc/{vmid}/config (API2/LXC/Config.pm update_vm),
// synchronous (no task, unlike qemu-server's POST): "no options
// specified" for nothing to do, then under the config lock: the config
// loaded, its lock checked, the digest compared, the privileges of the
// keys deleted, reverted and set checked (checkCTModifyPermLocked), the
// update's own refusals (update_pct_config), and the changes written: all
// of them to a stopped CT, the hot-pluggable ones to a running CT, the
// rest to pending.
func (s *Server) putCTConfig(ctx context.Context, rq *request) (any, error) {
	vmid := s.vmid(rq)
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	set := map[string]string{}
	for k := range rq.params {
		if !updateOnlyParams[k] {
			set[k] = rq.str(k)
		}
	}
	deletes, reverts := splitList(rq.str("delete")), splitList(rq.str("revert"))
	if len(set) == 0 && len(deletes) == 0 && len(reverts) == 0 {
		return nil, fail("no options specified")
	}
	_, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		if err := checkLock(v); err != nil {
			return err
		}
		if d := rq.str("digest"); d != "" && d != confDigest(v.conf) {
			return fail("detected modified configuration - file changed by other user? Try again.")
		}
		unpriv := v.conf["unprivileged"] == "1"
		if err := s.checkCTModifyPermLocked(rq.authid, v, nil, deletes, unpriv); err != nil {
			return err
		}
		if err := s.checkCTModifyPermLocked(rq.authid, v, nil, reverts, unpriv); err != nil {
			return err
		}
		known := func(k string) bool { _, ok := rq.route.ep.Params.lookup(k); return ok && !updateOnlyParams[k] }
		if err := checkCTUpdateParams(known, set, deletes, reverts); err != nil {
			return err
		}
		if err := s.checkCTModifyPermLocked(rq.authid, v, set, nil, unpriv); err != nil {
			return err
		}
		return s.updateCTConfigLocked(v, set, deletes, reverts)
	})
	if err != nil {
		return nil, err
	}
	unlock()
	return nil, nil
}

// checkCTUpdateParams is update_vm's checks of revert and delete: a
// known option each (option_exists), not also set, not both.
func checkCTUpdateParams(known func(string) bool, set map[string]string, deletes, reverts []string) error {
	for _, k := range reverts {
		if !known(k) {
			return paramFail(ParamErrors{"revert": fmt.Sprintf("unknown option '%s'", k)})
		}
		if _, ok := set[k]; ok {
			return paramFail(ParamErrors{"revert": fmt.Sprintf("you can't use '-%s' and '-revert %s' at the same time", k, k)})
		}
	}
	for _, k := range deletes {
		if !known(k) {
			return paramFail(ParamErrors{"delete": fmt.Sprintf("unknown option '%s'", k)})
		}
		if _, ok := set[k]; ok {
			return paramFail(ParamErrors{"delete": fmt.Sprintf("you can't use '-%s' and -delete %s' at the same time", k, k)})
		}
		if slices.Contains(reverts, k) {
			return paramFail(ParamErrors{"delete": fmt.Sprintf("you can't use '-delete %s' and '-revert %s' at the same time", k, k)})
		}
	}
	return nil
}

// updateCTConfigLocked is update_pct_config with the apply or hotplug of
// pending that follows: reverts drop pending values, deletions of
// required or read-only options and changes of unprivileged are refused,
// a mount point or rootfs change is not emulated; then a stopped CT gets
// everything (applyCTPendingLocked), a running one its hot-pluggable
// options.
func (s *Server) updateCTConfigLocked(v *vm, set map[string]string, deletes, reverts []string) error {
	for _, k := range deletes {
		switch {
		case ctRequired[k]:
			return fail("unable to delete required option '%s'", k)
		case k == "unprivileged":
			return fail("unable to delete read-only option: '%s'", k)
		}
	}
	for _, k := range sortedKeys(set) {
		switch {
		case k == "unprivileged":
			return fail("unable to modify read-only option: '%s'", k)
		case k == "rootfs" || reMPKey.MatchString(k) || reDevKey.MatchString(k):
			return fail("pveemu: changing %s of a container is not emulated", k)
		}
	}
	if v.pending == nil {
		v.pending = map[string]string{}
	}
	if v.pendingDel == nil {
		v.pendingDel = map[string]bool{}
	}
	for _, k := range reverts {
		delete(v.pending, k)
		delete(v.pendingDel, k)
	}
	for _, k := range deletes {
		if _, inConf := v.conf[k]; !inConf {
			if _, inPending := v.pending[k]; !inPending {
				continue // "cannot delete '<k>' - not set in current configuration!": a warning
			}
		}
		v.pendingDel[k] = false
		delete(v.pending, k)
	}
	for k, val := range set {
		if k == "tags" {
			val = uniqueTags(val)
		}
		v.pending[k] = val
		delete(v.pendingDel, k)
	}
	if _, running := s.ctPIDLocked(v); running {
		for k, val := range v.pending {
			if ctFastplug[k] {
				v.conf[k] = val
				delete(v.pending, k)
			}
		}
		for k := range v.pendingDel {
			if ctFastplug[k] {
				delete(v.conf, k)
				delete(v.pendingDel, k)
			}
		}
		return nil
	}
	applyCTPendingLocked(s, v)
	return nil
}

// applyCTPendingLocked is LXC/Config.pm vmconfig_apply_pending: pending
// deletions, then pending values, into the config; a NIC is normalised
// (parse_lxc_network gives it a MAC and type=veth), and its IPAM entry
// follows (del_ips_from_mac of the old MAC or bridge, add_next_free_cidr
// of the new; failures are warnings there, ignored here).
func applyCTPendingLocked(s *Server, v *vm) {
	old := copyConf(v.conf)
	for k := range v.pendingDel {
		delete(v.conf, k)
	}
	for k, val := range v.pending {
		if reNetKey.MatchString(k) {
			val = normalizeLXCNet(val)
		}
		v.conf[k] = val
	}
	v.pending, v.pendingDel = nil, nil
	_ = s.ipamNICsOfLocked(v.vmid, old, v.conf, lxcNetMAC, v.conf["hostname"])
}

// checkCTModifyPermLocked is pve-container's check_ct_modify_config_perm
// for the keys set (with their values) or deleted (LXC.pm): root passes;
// cores, cpuunits and cpulimit need VM.Config.CPU; rootfs and mount
// points VM.Config.Disk (a bind or device mount root's alone); memory and
// swap VM.Config.Memory; a NIC VM.Config.Network and SDN.Use on its old
// and new bridge; devices and the hookscript root's alone; nameserver,
// searchdomain and hostname VM.Config.Network; features of a privileged
// CT root's alone, of an unprivileged one root's alone except nesting,
// which needs VM.Allocate; tags the tag permission; anything else
// VM.Config.Options.
func (s *Server) checkCTModifyPermLocked(authid string, v *vm, set map[string]string, deletes []string, unpriv bool) error {
	if authid == "root@pam" {
		return nil
	}
	check := func(k, val string, del bool) error {
		vmPerm := func(priv string) error { return s.vmPermLocked(authid, v.vmid, []string{priv}, false) }
		switch {
		case k == "cores" || k == "cpuunits" || k == "cpulimit":
			return vmPerm("VM.Config.CPU")
		case k == "rootfs" || reMPKey.MatchString(k):
			if err := vmPerm("VM.Config.Disk"); err != nil || del {
				return err
			}
			if vol, _, _ := strings.Cut(val, ","); strings.HasPrefix(strings.TrimPrefix(vol, "volume="), "/") {
				return permFail("mount point type bind is only allowed for root@pam")
			}
			return nil
		case k == "memory" || k == "swap":
			return vmPerm("VM.Config.Memory")
		case reNetKey.MatchString(k):
			if err := vmPerm("VM.Config.Network"); err != nil {
				return err
			}
			if old := v.conf[k]; old != "" {
				if err := s.checkBridgeAccessLocked(authid, map[string]string{k: old}); err != nil {
					return err
				}
			}
			if !del {
				return s.checkBridgeAccessLocked(authid, map[string]string{k: val})
			}
			return nil
		case reDevKey.MatchString(k):
			return permFail("configuring device passthrough is only allowed for root@pam")
		case k == "nameserver" || k == "searchdomain" || k == "hostname":
			return vmPerm("VM.Config.Network")
		case k == "features":
			return s.checkCTFeaturesPermLocked(authid, v, val, del, unpriv)
		case k == "hookscript":
			return permFail("changing the hookscript is only allowed for root@pam")
		case k == "tags":
			return s.tagPermLocked(authid, v.vmid)
		}
		return vmPerm("VM.Config.Options")
	}
	for _, k := range sortedKeys(set) {
		if err := check(k, set[k], false); err != nil {
			return err
		}
	}
	for _, k := range deletes {
		if err := check(k, "", true); err != nil {
			return err
		}
	}
	return nil
}

// checkCTFeaturesPermLocked is the features part of
// check_ct_modify_config_perm: a privileged CT's features are root's; of
// an unprivileged CT's, a change of nesting alone needs VM.Allocate on the
// CT, any other feature changed is root's.
func (s *Server) checkCTFeaturesPermLocked(authid string, v *vm, val string, del, unpriv bool) error {
	if !unpriv {
		return permFail("changing feature flags for privileged container is only allowed for root@pam")
	}
	parse := func(f string) map[string]string {
		out := map[string]string{}
		for _, part := range strings.Split(f, ",") {
			if k, v, ok := strings.Cut(part, "="); ok {
				out[k] = parseBoolText(v)
			}
		}
		return out
	}
	nesting, other := false, false
	switch old := v.conf["features"]; {
	case del:
		f := parse(old)
		_, hasNesting := f["nesting"]
		nesting, other = len(f) == 1 && hasNesting, len(f) > 0 && !(len(f) == 1 && hasNesting)
	case old != "":
		of, nf := parse(old), parse(val)
		for _, k := range append(sortedKeys(of), sortedKeys(nf)...) {
			if of[k] == nf[k] {
				continue
			}
			if k == "nesting" {
				nesting = true
				continue
			}
			other = true
			break
		}
	default:
		f := parse(val)
		_, hasNesting := f["nesting"]
		nesting, other = len(f) == 1 && hasNesting, len(f) > 0 && !(len(f) == 1 && hasNesting)
	}
	if other {
		return permFail("changing feature flags (except nesting) is only allowed for root@pam")
	}
	if nesting {
		return s.vmPermLocked(authid, v.vmid, []string{"VM.Allocate"}, false)
	}
	return nil
}
