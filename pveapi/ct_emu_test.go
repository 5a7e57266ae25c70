package pveapi_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// ctTemplate is the CT template ctNode adds.
const ctTemplate = 9100

// ctNode is the emulator's node with VM template 9000 and CT template
// 9100 "ct-debian" (two NICs on the host bridge vmbr0, a tag), both
// granted by pve-access-setup's grants, the zone sbz with vnet sbv0
// (DHCP) applied, and a client of the daemon's token (exactly the roles
// and ACLs pve-access-setup creates); the emulator records its privilege
// checks. It returns the token's id too.
func ctNode(t *testing.T, ctx context.Context) (*pveemu.Server, *pveapi.Client, string) {
	t.Helper()
	var token string
	s, c := oneNodeAs(t, ctx, nil, func(s *pveemu.Server) (string, string, error) {
		s.RecordPermChecks()
		err := s.AddCTTemplate(ctTemplate, "ct-debian", t.TempDir(), map[string]string{"tags": "tmpl",
			"net0": "name=eth0,bridge=vmbr0,ip=dhcp", "net1": "name=eth1,bridge=vmbr0,ip=dhcp"})
		if err != nil {
			return "", "", err
		}
		id, secret, err := s.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{9000, ctTemplate}})
		token = id
		return id, secret, err
	})
	sdnZone(t, ctx, c)
	return s, c, token
}

// netFields parses a CT NIC's value ("name=eth0,bridge=...").
func netFields(v string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(kv, "=")
		out[k] = val
	}
	return out
}

// TestCTThroughClient: the container calls as the daemon's token against
// the emulator (pve-container's behaviour): a CT template found by name,
// a linked clone into the pool, its config set in one update and read
// back (NIC, memory, swap 0, cores, tags, hostname; the template's other
// NIC gone), start, status, snapshot and rollback (the CT runs after it),
// a running CT's tags and hostname set alone (a pool claim: its NIC
// kept), stop (twice: a stopped CT is no error), delete of a running CT; then
// the error paths, the VM and CT id spaces apart; and every request and
// privilege check the token made is in the access table.
func TestCTThroughClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, c, token := ctNode(t, ctx)
	tmpl, err := c.CTTemplateID(ctx, "ct-debian")
	if err != nil || tmpl != ctTemplate {
		t.Fatalf("CT template: %d %v", tmpl, err)
	}
	if err := c.CloneCT(ctx, sandbox.CloneSpec{Template: tmpl, NewID: 150, Name: "box", Pool: access.DefaultPool}); err != nil {
		t.Fatal(err)
	}
	if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 160, Name: "vm", Pool: access.DefaultPool}); err != nil {
		t.Fatal(err)
	}
	want := sandbox.CTConfig{Tags: []string{"pvei-n-pve", "pvei-s-sbx1"}, Hostname: "web", Cores: 2, MemoryMiB: 1024,
		Bridges: []string{"sbv0"}, MACs: []string{"BC:24:11:AA:BB:01"}}
	if err := c.ConfigureCT(ctx, 150, want); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.CTConfigValues(ctx, 150)
	if err != nil {
		t.Fatal(err)
	}
	net0 := netFields(cfg["net0"])
	wantNet := map[string]string{"name": "eth0", "bridge": "sbv0", "hwaddr": "BC:24:11:AA:BB:01", "ip": "dhcp", "firewall": "0", "type": "veth"}
	for k, v := range wantNet {
		if net0[k] != v {
			t.Errorf("net0 %s = %q, want %q (net0 %q)", k, net0[k], v, cfg["net0"])
		}
	}
	for k, v := range map[string]string{"memory": "1024", "swap": "0", "cores": "2", "tags": "pvei-n-pve;pvei-s-sbx1", "hostname": "web", "unprivileged": "1", "net1": ""} {
		if cfg[k] != v {
			t.Errorf("config %s = %q, want %q", k, cfg[k], v)
		}
	}
	steps := []struct {
		name   string
		do     func() error
		status string // CT 150's status after the step
	}{
		{"start", func() error { return c.StartCT(ctx, 150) }, "running"},
		{"snapshot", func() error { return c.SnapshotCT(ctx, 150, "s1") }, "running"},
		{"rollback", func() error { return c.RollbackCT(ctx, 150, "s1") }, "running"},
		{"stop", func() error { return c.StopCT(ctx, 150) }, "stopped"},
		{"stop of a stopped CT", func() error { return c.StopCT(ctx, 150) }, "stopped"},
		{"start again", func() error { return c.StartCT(ctx, 150) }, "running"},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		info, err := c.CT(ctx, 150)
		if err != nil || info.Status != st.status {
			t.Fatalf("after %s: %+v %v, want %s", st.name, info, err, st.status)
		}
	}
	info, err := c.CT(ctx, 150)
	if err != nil || info.Name != "web" || info.Pool != access.DefaultPool || info.Template || !slices.Equal(info.Tags, want.Tags) {
		t.Errorf("CT 150: %+v %v", info, err)
	}
	// a warm pool claim's retag of the running CT: tags and hostname at
	// once (fast-plug), its NIC as it was
	if err := c.SetCTTags(ctx, 150, "pvei-sbx2-web", []string{"pvei-n-pve", "pvei-s-sbx2"}); err != nil {
		t.Fatal(err)
	}
	tagged, err := c.CTConfigValues(ctx, 150)
	if err != nil {
		t.Fatal(err)
	}
	if tagged["tags"] != "pvei-n-pve;pvei-s-sbx2" || tagged["hostname"] != "pvei-sbx2-web" || tagged["net0"] != cfg["net0"] {
		t.Errorf("after SetCTTags: tags %q, hostname %q, net0 %q (was %q)", tagged["tags"], tagged["hostname"], tagged["net0"], cfg["net0"])
	}
	if info, err := c.CT(ctx, 150); err != nil || info.Status != "running" || info.Name != "pvei-sbx2-web" || !slices.Equal(info.Tags, []string{"pvei-n-pve", "pvei-s-sbx2"}) {
		t.Errorf("CT 150 after SetCTTags: %+v %v", info, err)
	}
	list, err := c.ListCTs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for _, ct := range list {
		ids = append(ids, ct.VMID)
		if ct.VMID == ctTemplate && (!ct.Template || ct.Name != "ct-debian") {
			t.Errorf("the template in the list: %+v", ct)
		}
	}
	if !slices.Equal(ids, []int{150, ctTemplate}) {
		t.Errorf("ListCTs: %v, want 150 and the template (no VM)", ids)
	}
	for _, e := range []struct {
		name string
		do   func() error
		want error // nil: no error
	}{
		{"no such CT template", func() error { _, err := c.CTTemplateID(ctx, "nope"); return err }, sandbox.ErrNotFound},
		{"a VM template's name", func() error { _, err := c.CTTemplateID(ctx, "tmpl"); return err }, sandbox.ErrNotFound},
		{"clone of a VM template", func() error {
			return c.CloneCT(ctx, sandbox.CloneSpec{Template: 9000, NewID: 170, Pool: access.DefaultPool})
		}, sandbox.ErrNotFound},
		{"clone of no template", func() error {
			return c.CloneCT(ctx, sandbox.CloneSpec{Template: 9999, NewID: 170, Pool: access.DefaultPool})
		}, sandbox.ErrNotFound},
		{"clone to a CT's id", func() error {
			return c.CloneCT(ctx, sandbox.CloneSpec{Template: tmpl, NewID: 150, Pool: access.DefaultPool})
		}, sandbox.ErrExists},
		{"clone to a VM's id", func() error {
			return c.CloneCT(ctx, sandbox.CloneSpec{Template: tmpl, NewID: 160, Pool: access.DefaultPool})
		}, sandbox.ErrExists},
		{"status of a VM's id", func() error { _, err := c.CT(ctx, 160); return err }, sandbox.ErrNotFound},
		{"status of no CT", func() error { _, err := c.CT(ctx, 4242); return err }, sandbox.ErrNotFound},
		{"config of a VM's id", func() error { _, err := c.CTConfigValues(ctx, 160); return err }, sandbox.ErrNotFound},
		{"config of no CT", func() error { _, err := c.CTConfigValues(ctx, 4242); return err }, sandbox.ErrNotFound},
		{"configure no CT", func() error { return c.ConfigureCT(ctx, 4242, want) }, sandbox.ErrNotFound},
		{"tag no CT", func() error { return c.SetCTTags(ctx, 4242, "x", want.Tags) }, sandbox.ErrNotFound},
		{"start of no CT", func() error { return c.StartCT(ctx, 4242) }, sandbox.ErrNotFound},
		{"stop of no CT", func() error { return c.StopCT(ctx, 4242) }, nil},
		{"snapshot name taken", func() error { return c.SnapshotCT(ctx, 150, "s1") }, sandbox.ErrExists},
		{"snapshot of no CT", func() error { return c.SnapshotCT(ctx, 4242, "s1") }, sandbox.ErrNotFound},
		{"rollback to no snapshot", func() error { return c.RollbackCT(ctx, 150, "nope") }, sandbox.ErrNotFound},
		{"delete of a VM's id", func() error { return c.DeleteCT(ctx, 160) }, sandbox.ErrNotFound},
		{"delete of no CT", func() error { return c.DeleteCT(ctx, 4242) }, sandbox.ErrNotFound},
	} {
		t.Run(e.name, func(t *testing.T) {
			err := e.do()
			if (e.want == nil) != (err == nil) || (e.want != nil && !errors.Is(err, e.want)) {
				t.Errorf("got %v, want %v", err, e.want)
			}
		})
	}
	if vm, err := c.VM(ctx, 160); err != nil || vm.Name != "vm" {
		t.Errorf("the VM of the id a CT call named: %+v %v", vm, err)
	}
	// A running CT is destroyed (force); then it is gone.
	if err := c.DeleteCT(ctx, 150); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CT(ctx, 150); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a deleted CT: %v", err)
	}
	if err := c.DeleteCT(ctx, 150); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("delete of a deleted CT: %v", err)
	}
	if gaps := s.AccessTableGaps(access.Calls(), token); len(gaps) > 0 {
		t.Errorf("the access table (pveapi/access Calls) misses what the container calls did:\n%s", strings.Join(gaps, "\n"))
	}
	less := slices.DeleteFunc(access.Calls(), func(c access.Call) bool { return strings.HasPrefix(c.Path, "/nodes/{node}/lxc") })
	if gaps := s.AccessTableGaps(less, token); !slices.Contains(gaps, "request PUT /nodes/{node}/lxc/{vmid}/config") {
		t.Errorf("a table without the container calls: gaps %v", gaps)
	}
}
