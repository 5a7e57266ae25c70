package pveemu

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// tokenOnHostBridges sets up the daemon's grants (a template on vmbr0,
// the emulator's default one on vnet1, a host bridge vmbr1 no template
// uses) and returns a request helper acting as the token.
func tokenOnHostBridges(t *testing.T) (*env, string, func(method, path string, form url.Values) resp) {
	t.Helper()
	e := newEnv(t)
	e.setupZone()
	if err := e.s.AddTemplate(context.Background(), 9001, "host", t.TempDir(), map[string]string{"net0": "virtio=BC:24:11:00:00:02,bridge=vmbr0"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddHostBridge("pve", "vmbr1"); err != nil {
		t.Fatal(err)
	}
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID, 9001}})
	if err != nil {
		t.Fatal(err)
	}
	return e, id, func(method, path string, form url.Values) resp {
		t.Helper()
		return e.do(method, path, form, authNone, "Authorization", "PVEAPIToken="+id+"="+secret)
	}
}

// hostileToken is tokenOnHostBridges with template 9001 cloned into the
// pool as VM 101 by the token.
func hostileToken(t *testing.T) (*env, string, func(method, path string, form url.Values) resp) {
	t.Helper()
	e, id, as := tokenOnHostBridges(t)
	r := as("POST", "/nodes/pve/qemu/9001/clone", url.Values{"newid": {"101"}, "pool": {access.DefaultPool}})
	if upid, _ := r.body["data"].(string); r.status != 200 || e.wait(upid) != "OK" {
		t.Fatalf("the token's clone: %d %q", r.status, r.reason)
	}
	return e, id, as
}

// TestShadowVNetReachesHostBridge: the NoAccess on
// /sdn/zones/localnetwork does not keep a holder of the token off a host
// bridge. check_vnet_access (pve-guest-common GuestHelpers.pm) takes the
// NIC's zone from vnets.cfg (the pending generation), and the token may
// create a vnet of any free name (SDN.Allocate on /sdn/zones/<zone>;
// pve-network VnetPlugin.pm pve-sdn-vnet-id has no check against the
// node's interfaces): a pending vnet named "vmbr1" makes the check ask
// /sdn/zones/<its zone>/vmbr1, which /sdn's role reaches. The vnet is then
// deleted (never applied): the NIC stays on "vmbr1", and at start
// pve-network Zones.pm tap_plug finds no vnet of that name in the running
// config and plugs the tap into the host bridge. The emulator lets it
// through as Proxmox does (the test pins that); no ACL can stop it, the
// grant table says so, and the doctor's pool-VM NIC check fails on such a
// VM (doctor/TestPoolNICCheck).
func TestShadowVNetReachesHostBridge(t *testing.T) {
	e, _, as := hostileToken(t)
	cfg := "/nodes/pve/qemu/101/config"
	if r := as("POST", cfg, url.Values{"net1": {"virtio,bridge=vmbr1"}}); r.status != 403 {
		t.Fatalf("net1 on vmbr1 directly: %d %q, want the 403 of the NoAccess", r.status, r.reason)
	}
	mustOK := func(method, path string, form url.Values) {
		t.Helper()
		if r := as(method, path, form); r.status != 200 {
			t.Fatalf("%s %s %v: %d %q", method, path, form, r.status, r.reason)
		}
	}
	mustOK("POST", "/cluster/sdn/zones", url.Values{"zone": {"evil"}, "type": {"simple"}})
	mustOK("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vmbr1"}, "zone": {"evil"}})
	r := as("POST", cfg, url.Values{"net1": {"virtio,bridge=vmbr1"}})
	if r.status != 200 {
		t.Fatalf("net1 on vmbr1 behind a pending vnet of that name: %d %q (Proxmox accepts it)", r.status, r.reason)
	}
	if st := e.wait(r.body["data"].(string)); st != "OK" {
		t.Fatalf("net1 on vmbr1 behind a pending vnet of that name: task %s", st)
	}
	mustOK("DELETE", "/cluster/sdn/vnets/vmbr1", nil)
	mustOK("DELETE", "/cluster/sdn/zones/evil", nil)
	r = as("GET", cfg, nil)
	conf, _ := r.body["data"].(map[string]any)
	if nic, _ := conf["net1"].(string); !strings.Contains(nic, "bridge=vmbr1") {
		t.Fatalf("net1 after the shadow vnet is gone: %q", nic)
	}
	t.Logf("as Proxmox: pool VM 101's net1 is on host bridge vmbr1, with no SDN.Use on %s/vmbr1", access.LocalZonePath)
}

// TestBridgelessNIC: a NIC without a bridge is QEMU user-mode
// networking (qemu-server QemuServer.pm print_netdev_full: type=user when
// $net->{bridge} is unset), and check_bridge_access skips it ("next if
// !defined($bridge)"): VM.Config.Network alone puts a pool VM on the
// host's own network stack (slirp: 10.0.2.2 is the host's loopback; its
// traffic is the host's output, so neither the SDN, the guard's forward
// rules nor the metadata prerouting drop see it). The emulator lets it
// through as Proxmox does; the doctor's pool-VM NIC check fails on it.
func TestBridgelessNIC(t *testing.T) {
	e, _, as := hostileToken(t)
	r := as("POST", "/nodes/pve/qemu/101/config", url.Values{"net1": {"virtio"}})
	if r.status != 200 {
		t.Fatalf("net1 without a bridge: %d %q (Proxmox accepts it with VM.Config.Network)", r.status, r.reason)
	}
	if st := e.wait(r.body["data"].(string)); st != "OK" {
		t.Fatalf("net1 without a bridge: task %s", st)
	}
	t.Log("as Proxmox: pool VM 101 has a user-mode (slirp) NIC; no SDN.Use was checked")
}

// TestSDNGrantStopsAtZones: the daemon's SDN calls need
// SDN.Allocate on /sdn itself (PUT /cluster/sdn, no propagation needed)
// and below /sdn/zones; /sdn's propagating role also reaches
// /sdn/ipams, /sdn/dns, /sdn/controllers and /sdn/fabrics (pve-network
// API2/Network/SDN/{Ipams,Dns,Controllers}.pm, Fabrics/Fabric.pm create:
// SDN.Allocate there), which let a leaked token make the nodes talk to
// hosts it names (an external IPAM's or PowerDNS's URL: requests from the
// host's own stack) or peer their FRR with its routers (controllers,
// fabrics). pve-access-setup grants the role on /sdn without propagation
// and on /sdn/zones with it (this failed while it propagated from /sdn).
func TestSDNGrantStopsAtZones(t *testing.T) {
	e, id, _ := hostileToken(t)
	for _, p := range []string{"/sdn/ipams", "/sdn/ipams/x", "/sdn/dns", "/sdn/controllers", "/sdn/fabrics", "/sdn/fabrics/x"} {
		if have := e.s.privileges(id, p); have["SDN.Allocate"] {
			t.Errorf("the token has SDN.Allocate on %s", p)
		}
	}
	// What the daemon needs stays.
	for _, p := range []string{"/sdn", "/sdn/zones", "/sdn/zones/sbx1", "/sdn/zones/sbx1/vnet1"} {
		if have := e.s.privileges(id, p); !have["SDN.Allocate"] {
			t.Errorf("the token lacks SDN.Allocate on %s", p)
		}
	}
}
