package doctor

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

const templateID = 9000

// node is an emulated node set up as pve-access-setup does, with the
// daemon's token client and a root client for faults.
type node struct {
	emu  *pveemu.Server
	px   *pveapi.Client
	root *pveapi.Client
	n    Node
}

func newNode(t *testing.T) *node {
	t.Helper()
	dir := t.TempDir()
	fb := pveemu.NewFakeBackend(filepath.Join(dir, "run"))
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close(); _ = fb.Close() })
	ctx := context.Background()
	if err := os.MkdirAll(filepath.Join(dir, "tpl"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddSandboxTemplate(ctx, templateID, filepath.Join(dir, "tpl"), "sandboxes"); err != nil {
		t.Fatal(err)
	}
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{templateID}, Transfer: access.TransferStorage})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	client := func(id, secret string) *pveapi.Client {
		c, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rid, rsecret, err := emu.RootToken("doctor-test")
	if err != nil {
		t.Fatal(err)
	}
	return &node{emu: emu, px: client(id, secret), root: client(rid, rsecret),
		n: Node{Name: "pve", Pool: access.DefaultPool, TokenID: id, Templates: map[string]int{"debian": templateID},
			TransferStorage: access.TransferStorage, RequireHardened: false, MinMajor: 9}}
}

func run(t *testing.T, c Check) Outcome {
	t.Helper()
	rep := Run(context.Background(), []Check{c})
	if len(rep.Checks) != 1 {
		t.Fatalf("%d results", len(rep.Checks))
	}
	r := rep.Checks[0]
	if rep.Pass != (r.Status != Fail) {
		t.Errorf("report pass %v with a %s result", rep.Pass, r.Status)
	}
	return Outcome{Status: r.Status, Detail: r.Detail, Fix: r.Fix}
}

// want checks an outcome's status and that its detail and fix name what
// they must.
func want(t *testing.T, o Outcome, st Status, detail, fix string) {
	t.Helper()
	if o.Status != st {
		t.Fatalf("status %s, want %s: %s (fix: %s)", o.Status, st, o.Detail, o.Fix)
	}
	if !strings.Contains(o.Detail, detail) {
		t.Errorf("detail %q does not name %q", o.Detail, detail)
	}
	if !strings.Contains(o.Fix, fix) {
		t.Errorf("fix %q does not name %q", o.Fix, fix)
	}
	if st == Fail && o.Fix == "" {
		t.Error("a failure without a fix")
	}
}

func TestVersionCheck(t *testing.T) {
	nd := newNode(t)
	want(t, run(t, VersionCheck(nd.px, nd.n)), Pass, "9.1", "")
	nd.n.MinMajor = 10
	want(t, run(t, VersionCheck(nd.px, nd.n)), Fail, "needs 10 or newer", "upgrade")
}

func TestPrivilegeCheck(t *testing.T) {
	nd := newNode(t)
	want(t, run(t, PrivilegeCheck(nd.px, nd.n, access.Calls())), Pass, "every privilege held", "")

	// The role without VM.Config.HWType: every hardened create is a 403.
	privs := slices.DeleteFunc(slices.Clone(access.RolePrivs(access.RoleMain)), func(p string) bool { return p == "VM.Config.HWType" })
	if err := nd.emu.AddRole(access.RoleMain, privs); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, PrivilegeCheck(nd.px, nd.n, access.Calls())), Fail, "needs VM.Config.HWType on /pool/pve-inspect", "grant VM.Config.HWType on /pool/pve-inspect")
}

func TestPrivilegeCheckTransferStorage(t *testing.T) {
	nd := newNode(t)
	// No Datastore.Allocate on the transfer storage: a failed transfer
	// leaks its image.
	if err := nd.emu.AddRole(access.RoleTransfer, []string{"Datastore.Audit"}); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, PrivilegeCheck(nd.px, nd.n, access.Calls())), Fail, "needs Datastore.Allocate on /storage/local", "Datastore.Allocate")
	// With the disk path off, the transfer storage's calls do not count.
	nd.n.TransferStorage = ""
	want(t, run(t, PrivilegeCheck(nd.px, nd.n, access.Calls())), Pass, "", "")
}

func TestStorageCheck(t *testing.T) {
	nd := newNode(t)
	want(t, run(t, StorageCheck(nd.px, nd.n)), Pass, "local-lvm (lvmthin, images,rootdir)", "")

	nd.emu.SetStorageContent("local-lvm", "rootdir")
	want(t, run(t, StorageCheck(nd.px, nd.n)), Fail, "without images", "pvesm set local-lvm --content rootdir,images")
}

// TestTransferStorageCheck: the transfer storage must list images (else a
// leaked transfer image is invisible); more content types than images
// warn, naming what the token's Datastore.Allocate reaches; no transfer
// storage skips.
func TestTransferStorageCheck(t *testing.T) {
	nd := newNode(t)
	for _, tc := range []struct {
		content     string
		st          Status
		detail, fix string
	}{
		{"backup,iso,vztmpl", Fail, `has content "backup,iso,vztmpl", without images`, "pvesm set local --content backup,iso,vztmpl,images"},
		{"backup,images,iso,vztmpl", Warn, "reaches ISO images (attach one to a pool VM, delete it); backups", "storage of their own with content images only"},
		{"images,import", Warn, "import volumes", "take the other content types off local"},
		{"images", Pass, "content images only", ""},
	} {
		t.Run(tc.content, func(t *testing.T) {
			nd.emu.SetStorageContent("local", tc.content)
			o := run(t, TransferStorageCheck(nd.px, nd.n))
			want(t, o, tc.st, tc.detail, tc.fix)
			if tc.st == Warn && o.Fix == "" {
				t.Error("a warning without a fix")
			}
		})
	}
	n := nd.n
	n.TransferStorage = ""
	want(t, run(t, TransferStorageCheck(nd.px, n)), Skip, "disk_transfer_storage is unset", "")
	n.TransferStorage = "fast"
	want(t, run(t, TransferStorageCheck(nd.px, n)), Fail, "storage fast: not defined", "define storage fast")
}

// TestReportWarnings: a warning keeps the run passing and prints its fix.
func TestReportWarnings(t *testing.T) {
	rep := Run(context.Background(), []Check{
		{Name: "a", Run: func(context.Context) Outcome { return passf("fine") }},
		{Name: "b", Run: func(context.Context) Outcome { return warnf("do this", "broad") }},
	})
	if !rep.Pass || len(rep.Warnings()) != 1 || len(rep.Failed()) != 0 {
		t.Fatalf("report %+v", rep)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "b WARNING: broad\n  change: do this") || !strings.Contains(out, "all checks pass, 1 with a warning") {
		t.Errorf("text:\n%s", out)
	}
}

func TestStorageCheckUnknownTransfer(t *testing.T) {
	nd := newNode(t)
	nd.n.TransferStorage = "fast"
	want(t, run(t, StorageCheck(nd.px, nd.n)), Fail, "storage fast: not defined", "define storage fast")
}

func TestTemplateChecks(t *testing.T) {
	nd := newNode(t)
	ctx := context.Background()
	tpl := filepath.Join(t.TempDir(), "tpl")
	if err := os.MkdirAll(tpl, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddTemplate(ctx, 9001, "nohotplug", tpl, map[string]string{"hotplug": "network,usb", "net0": pveemu.SandboxNet0}); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddTemplate(ctx, 9002, "noagent", tpl, map[string]string{"agent": "0", "net0": pveemu.SandboxNet0}); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddTemplate(ctx, 9003, "unhardened", tpl, map[string]string{"net0": pveemu.SandboxNet0, "args": "-chardev socket,id=x,path=/tmp/x"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddTemplate(ctx, 9004, "cloudinit", tpl, map[string]string{"net0": pveemu.SandboxNet0, "ide2": "local-lvm:vm-9004-cloudinit,media=cdrom", "ciuser": "admin"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddTemplate(ctx, 9005, "lsi", tpl, map[string]string{"net0": pveemu.SandboxNet0, "scsihw": "lsi"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddTemplate(ctx, 9006, "megasas", tpl, map[string]string{"net0": pveemu.SandboxNet0, "scsihw": "megasas"}); err != nil {
		t.Fatal(err)
	}
	// a UEFI guest's template, as a build of an OVA exported with EFI
	// firmware makes it
	if err := nd.emu.AddTemplate(ctx, 9007, "uefi", tpl, map[string]string{"net0": pveemu.SandboxNet0, "scsihw": "virtio-scsi-single", "bios": "ovmf",
		"efidisk0": "local-lvm:base-9007-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"/vms/9001", "/vms/9002", "/vms/9003", "/vms/9004", "/vms/9005", "/vms/9006", "/vms/9007"} {
		for _, who := range []string{access.User, nd.n.TokenID} {
			if err := nd.emu.SetACL(id, who, access.RoleTemplate, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name        string
		vmid        int
		hardened    bool
		transfer    string
		st          Status
		detail, fix string
	}{
		{"sandbox template", templateID, false, "local", Pass, "agent on", ""},
		{"no disk hotplug", 9001, false, "local", Fail, `hotplug "network,usb" lacks disk`, "qm set 9001 --hotplug network,usb,disk"},
		{"no disk hotplug, disk path off", 9001, false, "", Pass, "", ""},
		{"agent off: a template for VMs without an agent", 9002, false, "local", Pass, `agent off ("0"): for VMs created with agent false`, ""},
		{"not hardened", 9003, true, "local", Fail, "not hardened", "pve-inspectd template harden 9003"},
		{"cloud-init drive", 9004, false, "local", Pass, "cloud-init drive ide2 removed from every sandbox", ""},
		{"lsi controller", 9005, false, "local", Fail, "SCSI controller lsi cannot hot-plug disks", "qm set 9005 --scsihw virtio-scsi-single"},
		{"megasas controller", 9006, false, "local", Fail, "SCSI controller megasas cannot hot-plug disks", "qm set 9006 --scsihw virtio-scsi-single"},
		{"lsi controller, disk path off", 9005, false, "", Pass, "note: scsihw lsi cannot hot-plug disks", ""},
		{"virtio-scsi-single", templateID, false, "local", Pass, "scsihw virtio-scsi-single, agent on", ""},
		{"uefi, hardened for the creates that ask it", 9007, true, "local", Pass, `bios ovmf: only creates asking firmware "uefi" clone it`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nd.n
			n.Templates, n.RequireHardened, n.TransferStorage = map[string]int{"t": tc.vmid}, tc.hardened, tc.transfer
			checks := TemplateChecks(nd.px, n)
			if len(checks) != 1 {
				t.Fatalf("%d checks", len(checks))
			}
			want(t, run(t, checks[0]), tc.st, tc.detail, tc.fix)
		})
	}
	// A template the token cannot read.
	n := nd.n
	n.Templates = map[string]int{"gone": 9999}
	want(t, run(t, TemplateChecks(nd.px, n)[0]), Fail, "9999", "fix [api] templates")
}

func TestSDNCheck(t *testing.T) {
	nd := newNode(t)
	ok := func() (string, error) { return "/usr/sbin/dnsmasq", nil }
	want(t, run(t, SDNCheck(nd.px, ok)), Pass, "none pending", "")
	missing := func() (string, error) { return "", errors.New("not found in PATH") }
	want(t, run(t, SDNCheck(nd.px, missing)), Fail, "dnsmasq: not found", "apt install dnsmasq")

	// Another client's zone, created and not applied.
	if err := nd.root.CreateZone(context.Background(), sandbox.ZoneSpec{ID: "other"}); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, SDNCheck(nd.px, ok)), Fail, "pending SDN edits not applied: other (new)", "apply or revert them")
}

// TestSDNCheckNamesOtherDaemonsInFlight: a zone another node's daemon
// created and has not applied yet (a sandbox id, its vnet tagged with
// that daemon's node) is named, not failed on; anyone else's pending
// zone still fails the check.
func TestSDNCheckNamesOtherDaemonsInFlight(t *testing.T) {
	nd := newNode(t)
	ctx := context.Background()
	ok := func() (string, error) { return "/usr/sbin/dnsmasq", nil }
	if err := nd.root.CreateZone(ctx, sandbox.ZoneSpec{ID: "sbk2x9q0"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.root.CreateVNet(ctx, sandbox.VNetSpec{ID: "vk2x9q00", Zone: "sbk2x9q0", Alias: "pvei-n-pve2 pvei-s-sbk2x9q0"}); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, SDNCheck(nd.px, ok)), Pass, "in flight: sbk2x9q0 (new)", "")
	// a zone with a sandbox id but no daemon's vnet is anyone's
	if err := nd.root.CreateZone(ctx, sandbox.ZoneSpec{ID: "sbadmin1"}); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, SDNCheck(nd.px, ok)), Fail, "pending SDN edits not applied: sbadmin1 (new)", "apply or revert them")
}

// TestSDNCheckPendingVNet: a pending change of a vnet in someone else's
// zone (here a new vnet of an applied zone) fails the check: the daemon's
// next apply would commit it.
func TestSDNCheckPendingVNet(t *testing.T) {
	nd := newNode(t)
	ctx := context.Background()
	ok := func() (string, error) { return "/usr/sbin/dnsmasq", nil }
	if err := nd.root.CreateZone(ctx, sandbox.ZoneSpec{ID: "prod"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.root.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, SDNCheck(nd.px, ok)), Pass, "none pending", "")
	if err := nd.root.CreateVNet(ctx, sandbox.VNetSpec{ID: "prod0", Zone: "prod"}); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, SDNCheck(nd.px, ok)), Fail, "vnet prod0 of zone prod (new)", "apply or revert them")
}

// TestSDNLockCheck: a held SDN global lock (its token file) fails the
// check; none passes.
func TestSDNLockCheck(t *testing.T) {
	p := filepath.Join(t.TempDir(), ".lock")
	want(t, run(t, SDNLockCheck(p)), Pass, "not held", "")
	if err := os.WriteFile(p, []byte("0190c3a2-uuid"), 0o600); err != nil {
		t.Fatal(err)
	}
	want(t, run(t, SDNLockCheck(p)), Fail, "holds the SDN global lock", "pvesh delete /cluster/sdn/lock --force 1")
}

// TestNodeCheck: the daemon's node must be one of the cluster's, as
// Proxmox names it (no domain).
func TestNodeCheck(t *testing.T) {
	nd := newNode(t)
	want(t, run(t, NodeCheck(nd.px, nd.n)), Pass, "pve is one of the cluster's 1 node(s)", "")
	n := nd.n
	n.Name = "pve.lab.example"
	want(t, run(t, NodeCheck(nd.px, n)), Fail, `"pve.lab.example" is not a node of the cluster (nodes: pve)`, "without its domain")
}

func TestScopeCheck(t *testing.T) {
	nd := newNode(t)
	want(t, run(t, ScopeCheck(nd.px, nd.n, access.Calls())), Pass, "no privilege beyond", "")

	// An older setup's grants: Sys.Modify on / and the agent's
	// unrestricted privilege on the pool.
	if err := nd.emu.AddRole("OldInspect", []string{"Sys.Modify", "Sys.Audit"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.emu.AddRole("OldAgent", []string{"VM.GuestAgent.Unrestricted"}); err != nil {
		t.Fatal(err)
	}
	// What `template build` needs, given to the token by mistake.
	if err := nd.emu.AddRole("Builder", []string{"Sys.AccessNetwork"}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{access.User, nd.n.TokenID} {
		if err := nd.emu.SetACL("/", who, "OldInspect", false); err != nil {
			t.Fatal(err)
		}
		if err := nd.emu.SetACL("/", who, "Builder", false); err != nil {
			t.Fatal(err)
		}
		if err := nd.emu.SetACL("/pool/"+access.DefaultPool, who, "OldAgent", true); err != nil {
			t.Fatal(err)
		}
	}
	o := run(t, ScopeCheck(nd.px, nd.n, access.Calls()))
	want(t, o, Fail, "Sys.Modify on / (it could change the node's network", "run pve-access-setup again")
	want(t, o, Fail, "VM.GuestAgent.Unrestricted on /pool/pve-inspect", "")
	want(t, o, Fail, "Sys.AccessNetwork on / (it could make the node fetch any URL", "")
	if strings.Contains(o.Detail, "on /nodes/pve") || strings.Contains(o.Detail, "Datastore.Allocate on /storage/local") {
		t.Errorf("the table's own needs reported as broad: %s", o.Detail)
	}
}

// TestScopeCheckHostBridges: SDN.Use on a host bridge no template's NIC is
// on fails the scope check, whether propagated from /sdn (the grants
// before issue 36: no NoAccess on /sdn/zones/localnetwork, so no ACL path
// of its own shows it) or granted by hand; the templates' own bridge
// (vmbr0) is the table's.
func TestScopeCheckHostBridges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, nd *node)
		detail []string
	}{
		{"pve-access-setup's grants", func(*testing.T, *node) {}, nil},
		{"SDN.Use propagated from /sdn", func(t *testing.T, nd *node) {
			for _, who := range []string{access.User, nd.n.TokenID} {
				nd.emu.DeleteACL(access.LocalZonePath, who, access.RoleNoAccess)
			}
		}, []string{"SDN.Use on " + access.LocalZonePath + " (it could put pool VMs", "SDN.Use on " + access.LocalZonePath + "/vmbr1 "}},
		{"a hand-made grant on another bridge", func(t *testing.T, nd *node) {
			for _, who := range []string{access.User, nd.n.TokenID} {
				if err := nd.emu.SetACL(access.LocalZonePath+"/vmbr1", who, access.RoleBridge, false); err != nil {
					t.Fatal(err)
				}
			}
		}, []string{"SDN.Use on " + access.LocalZonePath + "/vmbr1 "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nd := newNode(t)
			if err := nd.emu.AddHostBridge("pve", "vmbr1"); err != nil {
				t.Fatal(err)
			}
			tc.change(t, nd)
			o := run(t, ScopeCheck(nd.px, nd.n, access.Calls()))
			if tc.detail == nil {
				want(t, o, Pass, "no privilege beyond", "")
				return
			}
			for _, d := range tc.detail {
				want(t, o, Fail, d, "run pve-access-setup again")
			}
			if strings.Contains(o.Detail, access.LocalZonePath+"/vmbr0 ") {
				t.Errorf("the template's bridge reported as broad: %s", o.Detail)
			}
		})
	}
}

// TestPrivilegeCheckTemplateNICs: a template NIC's bridge is checked where
// check_vnet_access checks it: on its SDN vnet's zone when it is a vnet
// (reached by /sdn's grant), on localnetwork when it is a host bridge
// (only the bridges pve-access-setup found on the templates).
func TestPrivilegeCheckTemplateNICs(t *testing.T) {
	nd := newNode(t)
	ctx := context.Background()
	if err := nd.root.CreateZone(ctx, sandbox.ZoneSpec{ID: "tplz"}); err != nil {
		t.Fatal(err)
	}
	if err := nd.root.CreateVNet(ctx, sandbox.VNetSpec{ID: "tplnet", Zone: "tplz"}); err != nil {
		t.Fatal(err)
	}
	tpl := filepath.Join(t.TempDir(), "tpl")
	if err := os.MkdirAll(tpl, 0o755); err != nil {
		t.Fatal(err)
	}
	for id, net0 := range map[int]string{9001: "virtio,bridge=tplnet", 9002: "virtio,bridge=vmbr1"} {
		if err := nd.emu.AddTemplate(ctx, id, fmt.Sprint("t", id), tpl, map[string]string{"net0": net0}); err != nil {
			t.Fatal(err)
		}
		for _, who := range []string{access.User, nd.n.TokenID} {
			if err := nd.emu.SetACL(fmt.Sprint("/vms/", id), who, access.RoleTemplate, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	n := nd.n
	n.Templates = map[string]int{"debian": templateID, "onvnet": 9001}
	want(t, run(t, PrivilegeCheck(nd.px, n, access.Calls())), Pass, "every privilege held", "")
	n.Templates["onvmbr1"] = 9002
	want(t, run(t, PrivilegeCheck(nd.px, n, access.Calls())), Fail, "needs SDN.Use on "+access.LocalZonePath+"/vmbr1", "run pve-access-setup again")
}

func TestIPAMCheck(t *testing.T) {
	nd := newNode(t)
	want(t, run(t, IPAMCheck(nd.px)), Pass, "IPAM pve", "")
	// A node whose pve IPAM is gone (or a token without SDN.Audit).
	want(t, run(t, IPAMCheck(fakeAPI{})), Fail, "GET /cluster/sdn/ipams/pve/status", "--ipam pve --type pve")
	// The Proxmox API does not answer at all.
	want(t, run(t, VersionCheck(fakeAPI{}, nd.n)), Fail, "GET /version", "[api.proxmox] url")
}
