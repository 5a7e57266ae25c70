package doctor

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// PoolNICCheck reads every VM of the daemon's pool and fails on a NIC the
// daemon never makes: one without a bridge (qemu-server's
// print_netdev_full gives it QEMU's user-mode network, so the guest's
// traffic leaves as the host's own, past every guard rule) and, on a VM
// tagged as a sandbox's (pvei-s-<id>), one on anything but a vnet of that
// sandbox's zone. The token's grants cannot rule these out (a stolen
// token may create a vnet named like a host bridge, check it, delete it
// before the start, or give a NIC no bridge; pve-network Zones.pm
// tap_plug plugs a NIC whose bridge is no running vnet into the host
// bridge of that name). A pool VM without a sandbox tag on another bridge
// is a warning: a clone being configured, or a VM the daemon did not make.
// A sandbox VM's NIC on a vnet of [api] shared_vnets (n.SharedVNets) is
// one the daemon makes.
func PoolNICCheck(px API, n Node) Check {
	return Check{Name: "pool VM NICs", Run: func(ctx context.Context) Outcome {
		var pool struct {
			Members []struct {
				Type     string `json:"type"`
				VMID     int    `json:"vmid"`
				Node     string `json:"node"`
				Template int    `json:"template"`
			} `json:"members"`
		}
		if err := px.Get(ctx, "/pools/"+url.PathEscape(n.Pool), &pool); err != nil {
			return failf("run pve-access-setup (it makes the pool and grants Pool.Audit on it)", "GET /pools/%s: %v", n.Pool, err)
		}
		var vnets []struct {
			VNet    string `json:"vnet"`
			Zone    string `json:"zone"`
			Pending *struct {
				Zone string `json:"zone"`
			} `json:"pending"`
		}
		if err := px.Get(ctx, "/cluster/sdn/vnets?pending=1", &vnets); err != nil {
			return failf("the token lists the SDN vnets (SDN.Audit below /sdn/zones); run pve-access-setup", "GET /cluster/sdn/vnets: %v", err)
		}
		zoneOf := map[string]string{}
		for _, v := range vnets {
			z := v.Zone
			if z == "" && v.Pending != nil {
				z = v.Pending.Zone
			}
			zoneOf[v.VNet] = z
		}
		var bad, odd []string
		vms := 0
		for _, m := range pool.Members {
			if m.Type != "qemu" || m.Template == 1 {
				continue
			}
			vms++
			var conf map[string]any
			if err := px.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", url.PathEscape(m.Node), m.VMID), &conf); err != nil {
				return failf("the token reads its pool's VMs (VM.Audit)", "GET the config of VM %d: %v", m.VMID, err)
			}
			sb := ""
			for _, t := range strings.Split(fmt.Sprint(conf["tags"]), ";") {
				if id, ok := strings.CutPrefix(strings.TrimSpace(t), "pvei-s-"); ok {
					sb = id
				}
			}
			keys := make([]string, 0, len(conf))
			for k := range conf {
				if reNetKey.MatchString(k) {
					keys = append(keys, k)
				}
			}
			slices.Sort(keys)
			for _, k := range keys {
				bridge := nicBridge(fmt.Sprint(conf[k]))
				switch {
				case bridge == "":
					bad = append(bad, fmt.Sprintf("VM %d %s has no bridge (QEMU's user-mode network: the host's own traffic)", m.VMID, k))
				case sb != "" && n.sharedVNet(bridge, zoneOf):
				case sb != "" && zoneOf[bridge] != sb:
					where := "a host bridge or no vnet"
					if z, ok := zoneOf[bridge]; ok {
						where = "a vnet of zone " + z
					}
					bad = append(bad, fmt.Sprintf("VM %d (sandbox %s) %s is on %s (%s), not on its sandbox's vnets", m.VMID, sb, k, bridge, where))
				case sb == "" && !strings.HasPrefix(zoneOf[bridge], "sb"):
					odd = append(odd, fmt.Sprintf("VM %d %s on %s", m.VMID, k, bridge))
				}
			}
		}
		if len(bad) > 0 {
			return failf("stop and destroy these VMs (qm stop ID; qm destroy ID), revoke the daemon's token if nothing of yours made them (pveum user token remove), and run pve-access-setup again",
				"pool VMs with a NIC the daemon never makes: %s", strings.Join(bad, "; "))
		}
		if len(odd) > 0 {
			return warnf("a VM of the pool without a sandbox tag: a clone still being configured (look again), or a VM the daemon did not make (move it out of the pool)",
				"pool VMs without a sandbox tag, on other bridges: %s", strings.Join(odd, "; "))
		}
		return passf("%d pool VMs, every NIC on its sandbox's vnets or a shared vnet", vms)
	}}
}

// sharedVNet reports whether bridge is a vnet the node shares ([api]
// shared_vnets): listed, and an SDN vnet of a zone that is no sandbox's
// (as the daemon checks it, sandbox sharedvnets.go).
func (n Node) sharedVNet(bridge string, zoneOf map[string]string) bool {
	z, ok := zoneOf[bridge]
	return ok && slices.Contains(n.SharedVNets, bridge) && !sandbox.ValidID(z)
}

// nicBridge is the bridge of a NIC's config value ("" when none).
func nicBridge(v string) string {
	for _, kv := range strings.Split(v, ",") {
		if b, ok := strings.CutPrefix(kv, "bridge="); ok {
			return b
		}
	}
	return ""
}
