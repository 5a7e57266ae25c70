package templatebuild_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestBuildOnBed: the build on the emulator wired to the test bed, as on
// a node: the image and its checksum list come from the uplink's HTTP
// server (fetched from the node's network namespace, the download by the
// emulated node itself), the build VM's guest is a real one on a real
// SDN vnet, and every agent call goes through this project's qga client
// to the guest's real qemu-ga. The template then clones, and the clone's
// agent answers. Then the shipped kali2025.4 recipe builds from a mirror
// on the uplink (MIRROR/kali2025.4/: a .tar.xz of a small disk.raw and its
// SHA256SUMS): the node's own download from the node's network namespace,
// the archive unpacked and uploaded by the build, the recipe's own checks
// through the real agent.
func TestBuildOnBed(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	images := t.TempDir()
	img := bytes.Repeat([]byte("bed-cloud-image "), 1<<16)
	sum := sha256.Sum256(img)
	kali := templatebuild.Recipes()["kali2025.4"]
	archive, err := pveemu.CloudRawTarXZ(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	asum := sha256.Sum256(archive)
	if err := os.MkdirAll(filepath.Join(images, "kali2025.4"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"cloud.raw": img, "SHA256SUMS": []byte(hex.EncodeToString(sum[:]) + "  cloud.raw\n"),
		"kali2025.4/" + kali.Image.Listed(): archive, "kali2025.4/SHA256SUMS": []byte(hex.EncodeToString(asum[:]) + "  " + kali.Image.Listed() + "\n")} {
		if err := os.WriteFile(filepath.Join(images, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bed, err := testvm.Up(ctx, testvm.Options{ImagesDir: images})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.Close() })
	backend := pveemu.BedBackend{Bed: bed}
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: backend, DataDir: filepath.Join(bed.Dir(), "pveemu"), RootPassword: emuRootPassword})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); _ = s.Close() })
	// A bed guest's root is the host's, overlaid by its disk directory:
	// the host's own cloud-init (if any) never finishes in it, so the
	// build VM (the first VM, 100) gets a cloud-init that is done, as an
	// image's is once its first boot ran.
	ci := filepath.Join(s.DiskDir(100), "upper", "usr", "local", "bin", "cloud-init")
	if err := os.MkdirAll(filepath.Dir(ci), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ci, []byte("#!/bin/sh\necho 'status: done'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.SetStorageContent("local", "backup,iso,vztmpl,import,snippets")
	px, err := pveapi.NewWithPassword(pveapi.Options{URL: ts.URL + "/api2/json", Node: "pve", HTTPClient: ts.Client(), TaskPoll: 20 * time.Millisecond}, "root@pam", emuRootPassword)
	if err != nil {
		t.Fatal(err)
	}
	if err := px.CreateZone(ctx, sandbox.ZoneSpec{ID: "bz"}); err != nil {
		t.Fatal(err)
	}
	if err := px.CreateVNet(ctx, sandbox.VNetSpec{ID: "bzv0", Zone: "bz"}); err != nil {
		t.Fatal(err)
	}
	if err := px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "bzv0", CIDR: "10.77.0.0/24", Gateway: "10.77.0.1", SNAT: true, DHCPRanges: []apitype.DHCPRange{{Start: "10.77.0.50", End: "10.77.0.99"}}}); err != nil {
		t.Fatal(err)
	}
	// The clone's zone, apart from the build's as a sandbox's is. (bzv0
	// would do too: the IPAM gives the clone the build VM's freed address,
	// and the bed drops the build NIC's ethers line for it as pve-network's
	// add_ip_mapping does; testvm TestEthersAddressGivenAgain.)
	if err := px.CreateZone(ctx, sandbox.ZoneSpec{ID: "cz"}); err != nil {
		t.Fatal(err)
	}
	if err := px.CreateVNet(ctx, sandbox.VNetSpec{ID: "czv0", Zone: "cz"}); err != nil {
		t.Fatal(err)
	}
	if err := px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "czv0", CIDR: "10.78.0.0/24", Gateway: "10.78.0.1", SNAT: true, DHCPRanges: []apitype.DHCPRange{{Start: "10.78.0.50", End: "10.78.0.99"}}}); err != nil {
		t.Fatal(err)
	}
	if err := px.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
	agent := templatebuild.AgentSockets(qga.New(qga.Options{}), bed.QGADir())
	host := templatebuild.NodeHost{HTTPClient: &http.Client{Transport: &http.Transport{DialContext: backend.DialContext}}, StateDir: t.TempDir()}
	r := templatebuild.Generic(templatebuild.Image{URL: testvm.ImagesURL("cloud.raw"), File: "cloud.raw", ChecksumURL: testvm.ImagesURL("SHA256SUMS"), ChecksumAlg: "sha256"})
	var out bytes.Buffer
	b, err := templatebuild.New(px, agent, host, templatebuild.Options{Name: "bedtmpl", Recipe: r, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
		Bridge: "bzv0", AgentWait: time.Minute, AgentPoll: 200 * time.Millisecond, CloudInitWait: time.Minute, Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(ctx)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out.String())
	}
	t.Logf("build:\n%s", out.String())
	for _, want := range []string{"Proxmox verifies its sha256", "the guest agent answers", "cloud-init: done", "command -v qemu-ga: ok", "tagged inspect;pvei-template"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	conf, err := px.VMConfig(ctx, res.VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["template"] != "1" || !hardening.Check(conf).OK() {
		t.Errorf("template %v: %v", conf, hardening.Check(conf).Failed())
	}
	// What the clones must not share is gone from the template's disk.
	for _, f := range []string{"var/lib/dhcp/dhclient.eth0.leases", "etc/machine-id"} {
		if b, err := os.ReadFile(filepath.Join(s.DiskDir(res.VMID), "upper", f)); err == nil && len(b) > 0 {
			t.Errorf("template keeps %s: %q", f, b)
		}
	}
	if err := px.CloneVM(ctx, sandbox.CloneSpec{Template: res.VMID, NewID: 600, Name: "clone"}); err != nil {
		t.Fatal(err)
	}
	if err := px.ConfigureVM(ctx, 600, sandbox.VMConfig{Cores: 1, MemoryMiB: 512, Bridges: []string{"czv0"}}); err != nil {
		t.Fatal(err)
	}
	if err := px.StartVM(ctx, 600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.DeleteVM(context.Background(), 600) })
	var ares templatebuild.AgentResult
	for deadline := time.Now().Add(time.Minute); ; {
		if ares, err = agent.Exec(ctx, 600, []string{"echo", "clone-answers"}, 10*time.Second); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || ares.Exit != 0 || ares.Output != "clone-answers\n" {
		t.Errorf("clone's agent: %+v %v", ares, err)
	}

	kali, err = templatebuild.MirrorRecipe(kali, testvm.ImagesURL(""))
	if err != nil {
		t.Fatal(err)
	}
	next, err := px.NextID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ci = filepath.Join(s.DiskDir(next), "upper", "usr", "local", "bin", "cloud-init")
	if err := os.MkdirAll(filepath.Dir(ci), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ci, []byte("#!/bin/sh\necho 'status: done'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	b, err = templatebuild.New(px, agent, host, templatebuild.Options{Name: "bedkali", Recipe: kali, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
		Bridge: "bzv0", AgentWait: time.Minute, AgentPoll: 200 * time.Millisecond, CloudInitWait: time.Minute, LockDir: t.TempDir(), Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, err = b.Run(ctx)
	if err != nil {
		t.Fatalf("kali build: %v\n%s", err, out.String())
	}
	t.Logf("kali build:\n%s", out.String())
	for _, want := range []string{"uploaded disk.raw: 1048576 bytes", "as its checksum says", "dpkg-query -W qemu-guest-agent python3 gcc make: ok", "tagged builtin-kali2025.4;inspect;pvei-template"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("kali progress lacks %q", want)
		}
	}
	if conf, err := px.VMConfig(ctx, res.VMID); err != nil || conf["template"] != "1" || !hardening.Check(conf).OK() {
		t.Errorf("kali template %v %v", conf, err)
	}
}
