package access

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// reNetKey matches the config keys of a VM's NICs.
var reNetKey = regexp.MustCompile(`^net\d+$`)

// NICPaths returns the ACL paths qemu-server's check_bridge_access checks
// SDN.Use on for the NICs of the VM config conf (pve-guest-common
// GuestHelpers.pm check_vnet_access): for a NIC with a VLAN tag
// /sdn/zones/<zone>/<bridge>/<tag>, and the same for each VLAN of its
// trunks ("10;20-22": 10, 20, 21, 22; a range whose end is not above its
// start is its start alone); for a NIC with neither
// /sdn/zones/<zone>/<bridge>. zone is zoneOf(bridge), the vnet's zone in
// vnets.cfg, or LocalZone when it gives "" (a host bridge). NICs without a
// bridge are skipped. Sorted, without repeats.
func NICPaths(conf map[string]string, zoneOf func(bridge string) string) []string {
	var out []string
	for k, v := range conf {
		if !reNetKey.MatchString(k) {
			continue
		}
		opts := map[string]string{}
		for _, part := range strings.Split(v, ",") {
			if key, val, ok := strings.Cut(part, "="); ok {
				opts[key] = val
			}
		}
		bridge := opts["bridge"]
		if bridge == "" {
			continue
		}
		zone := zoneOf(bridge)
		if zone == "" {
			zone = LocalZone
		}
		base := "/sdn/zones/" + zone + "/" + bridge
		if opts["tag"] != "" {
			out = append(out, base+"/"+opts["tag"])
		}
		for _, tag := range trunkTags(opts["trunks"]) {
			out = append(out, base+"/"+strconv.Itoa(tag))
		}
		if opts["tag"] == "" && opts["trunks"] == "" {
			out = append(out, base)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// trunkTags expands a NIC's trunks as pve-guest-common's
// get_tags_from_trunk does.
func trunkTags(trunks string) []int {
	var out []int
	if trunks == "" {
		return nil
	}
	for _, t := range strings.Split(trunks, ";") {
		a, b, _ := strings.Cut(t, "-")
		start, err := strconv.Atoi(a)
		if err != nil {
			continue
		}
		end, err := strconv.Atoi(b)
		if err != nil || end <= start {
			end = start
		}
		for tag := start; tag <= end; tag++ {
			out = append(out, tag)
		}
	}
	return out
}

// TemplateBridges splits the NICPaths of the templates' configs into the
// paths below LocalZonePath (host bridges: what Setup.Bridges and the
// RoleBridge grants name) and those below /sdn/zones of NICs on SDN vnets
// ("<zone>/<vnet>[/<tag>]", reached by /sdn's grant), each sorted, without
// repeats.
func TemplateBridges(confs []map[string]string, zoneOf func(bridge string) string) (local, vnets []string) {
	for _, conf := range confs {
		for _, p := range NICPaths(conf, zoneOf) {
			if b, ok := strings.CutPrefix(p, LocalZonePath+"/"); ok {
				local = append(local, b)
			} else {
				vnets = append(vnets, strings.TrimPrefix(p, "/sdn/zones/"))
			}
		}
	}
	slices.Sort(local)
	slices.Sort(vnets)
	return slices.Compact(local), slices.Compact(vnets)
}
