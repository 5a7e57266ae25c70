package pveapi_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestCloneToAnotherNodesVMID: against the emulator's two-node cluster,
// a clone on one node to the id of the other node's VM fails in its task
// with pmxcfs's rename error, which the client classifies as ErrExists
// (so a create takes another id), and VMIDFree asks the whole cluster.
func TestCloneToAnotherNodesVMID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	fb1, fb2 := pveemu.NewFakeBackend(filepath.Join(dir, "r1")), pveemu.NewFakeBackend(filepath.Join(dir, "r2"))
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb1, DataDir: filepath.Join(dir, "data"), StatsInterval: -1,
		Cluster: []pveemu.ClusterNode{{Name: "pve2", Backend: fb2}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = fb1.Close(); _ = fb2.Close() })
	disk := filepath.Join(dir, "disk")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{9000, 9001} {
		if err := s.AddTemplate(ctx, id, "tmpl", disk, map[string]string{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MoveVM(9001, "pve2"); err != nil {
		t.Fatal(err)
	}
	id, secret, err := s.RootToken("cluster-test")
	if err != nil {
		t.Fatal(err)
	}
	h2, err := s.NodeHandler("pve2")
	if err != nil {
		t.Fatal(err)
	}
	ts1, ts2 := httptest.NewServer(s), httptest.NewServer(h2)
	t.Cleanup(func() { ts1.Close(); ts2.Close() })
	client := func(ts *httptest.Server, node string) *pveapi.Client {
		c, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: node, HTTPClient: ts.Client(), TaskPoll: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := client(ts1, "pve"), client(ts2, "pve2")
	if err := c2.CloneVM(ctx, sandbox.CloneSpec{Template: 9001, NewID: 150, Name: "on-pve2"}); err != nil {
		t.Fatal(err)
	}
	err = c1.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 150, Name: "on-pve"})
	if !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("clone on pve to pve2's 150: %v, want ErrExists", err)
	}
	for _, c := range []struct {
		id   int
		free bool
	}{{150, false}, {151, true}, {9001, false}} {
		if free, err := c1.VMIDFree(ctx, c.id); err != nil || free != c.free {
			t.Errorf("VMIDFree(%d) = %v %v, want %v", c.id, free, err, c.free)
		}
	}
}

// TestStartDuringAnApply: another client's SDN apply has the node's
// dnsmasqs stopped when a VM starts there; the pve-bridge hook fails
// (its dnsmasq reload, then its D-Bus lease update) and QEMU does not
// start, so StartVM starts again, until the apply is done and the VM
// runs.
func TestStartDuringAnApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, c := oneNode(t, ctx, map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=sbv0"})
	sdnZone(t, ctx, c)
	if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 150, Name: "first-start"}); err != nil {
		t.Fatal(err)
	}
	held, release := s.HoldReloads()
	defer release()
	applied := make(chan error, 1)
	go func() { applied <- c.ApplySDN(ctx) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the apply's reload never started")
	}
	// Every start fails in the hook while the apply has dnsmasq stopped
	// (the first in its reload, the next in their D-Bus lease update);
	// the apply ends a second later, and StartVM starts until then.
	go func() { time.Sleep(time.Second); release() }()
	if err := c.StartVM(ctx, 150); err != nil {
		t.Fatalf("first start while an apply has dnsmasq stopped: %v", err)
	}
	starts := 0
	for _, r := range s.Requests() {
		if r.Route == "/nodes/{node}/qemu/{vmid}/status/start" {
			starts++
		}
	}
	if starts < 3 {
		t.Errorf("%d start requests, want at least 3 (every start failed in the hook while the apply ran)", starts)
	}
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if info, err := c.VM(ctx, 150); err != nil || info.Status != "running" {
		t.Errorf("vm 150: %+v %v", info, err)
	}
}

// TestSDNLockedSaysSo: an SDN edit refused for another client's global
// lock says so, naming the lock, not only Proxmox's terse message.
func TestSDNLockedSaysSo(t *testing.T) {
	err := pveapi.Classify("create zone sbk2x9q0", errors.New("500 create sdn zone object failed: invalid lock token provided! at /usr/share/perl5/PVE/Network/SDN.pm line 291."))
	if err == nil || !strings.Contains(err.Error(), "another client holds the SDN global lock") || !strings.Contains(err.Error(), "invalid lock token provided") {
		t.Fatalf("%v", err)
	}
}

// TestImageVolumes: the images of a storage, as the sweep lists them, only
// once the storage is configured for images (pve-storage volume_list).
func TestImageVolumes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, c := oneNode(t, ctx, map[string]string{})
	if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 150, Name: "owner"}); err != nil {
		t.Fatal(err)
	}
	volid, err := c.AllocVolume(ctx, "local", 150, "vm-150-pvei-0123456789ab.raw", 1024)
	if err != nil {
		t.Fatal(err)
	}
	if vols, err := c.ImageVolumes(ctx, "local"); err != nil || len(vols) != 0 {
		t.Errorf("local without images content: %v %v", vols, err)
	}
	s.SetStorageContent("local", "backup,images,iso,vztmpl")
	vols, err := c.ImageVolumes(ctx, "local")
	if err != nil || len(vols) != 1 || vols[0].VolID != volid || vols[0].VMID != 150 {
		t.Errorf("local with images: %+v %v, want %s of 150", vols, err, volid)
	}
}

// sdnZone creates and applies, through c, the zone sbz with vnet sbv0
// and its subnet 10.9.0.0/24 with DHCP (.10 to .20).
func sdnZone(t *testing.T, ctx context.Context, c *pveapi.Client) {
	t.Helper()
	if err := c.CreateZone(ctx, sandbox.ZoneSpec{ID: "sbz"}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateVNet(ctx, sandbox.VNetSpec{ID: "sbv0", Zone: "sbz"}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "sbv0", CIDR: "10.9.0.0/24", Gateway: "10.9.0.1", DHCPRanges: []apitype.DHCPRange{{Start: "10.9.0.10", End: "10.9.0.20"}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
}

// oneNode is the emulator's single node "pve" on a fake backend with
// template 9000 of conf, and a client of it with a root token.
func oneNode(t *testing.T, ctx context.Context, conf map[string]string) (*pveemu.Server, *pveapi.Client) {
	t.Helper()
	return oneNodeAs(t, ctx, conf, func(s *pveemu.Server) (string, string, error) { return s.RootToken("one-node") })
}

// oneNodeAs is oneNode with a client of the token that token makes.
func oneNodeAs(t *testing.T, ctx context.Context, conf map[string]string, token func(*pveemu.Server) (id, secret string, err error)) (*pveemu.Server, *pveapi.Client) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	fb := pveemu.NewFakeBackend(filepath.Join(dir, "run"))
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), StatsInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = fb.Close() })
	disk := filepath.Join(dir, "disk")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTemplate(ctx, 9000, "tmpl", disk, conf); err != nil {
		t.Fatal(err)
	}
	id, secret, err := token(s)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	c, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}
