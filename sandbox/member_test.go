package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// ctBench is an engine on the fakes with a container API: a VM template
// "debian" (9000) and a container template "ct-debian" (9100), whose
// config is ctConf unless a test changes it.
type ctBench struct {
	p       *apitest.Proxmox
	cts     *apitest.CTs
	g       *apitest.Guests
	o       sandbox.Options
	entered atomic.Int64 // calls of CTGuests
}

var ctConf = map[string]string{"unprivileged": "1", "ostype": "debian", "rootfs": "local-lvm:base-9100-disk-0,size=2G",
	"net0": "name=eth0,bridge=vmbr0,ip=dhcp,hwaddr=BC:24:11:00:00:01,type=veth", "memory": "512"}

func newCTBench(t *testing.T, conf map[string]string) *ctBench {
	t.Helper()
	b := &ctBench{g: apitest.NewGuests()}
	b.p = apitest.NewProxmox(b.g, map[string]int{"debian": 9000})
	b.cts = apitest.NewCTs(b.p)
	b.cts.AddTemplate(9100, "ct-debian", conf)
	b.o = sandbox.Options{Node: "node1", Proxmox: b.p, Guests: b.g.Dial, Containers: b.cts,
		CTGuests: func(vmid int) sandbox.Guest {
			b.entered.Add(1)
			return b.g.Dial(strconv.Itoa(vmid) + ".qga")
		},
		StateDir: t.TempDir(), AgentTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return b
}

func (b *ctBench) engine(t *testing.T) *sandbox.Engine {
	t.Helper()
	e, err := sandbox.New(b.o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

func mixed() apitype.CreateRequest {
	req := oneVM("debian")
	req.VMs = append(req.VMs, apitype.VMRequest{Name: "target", Kind: apitype.KindLXC, Template: "ct-debian", Cores: 1, MemoryMiB: 256, Networks: []string{"net0"}})
	req.Env = map[string]string{"API_KEY": "k"}
	return req
}

// TestContainerMember: a sandbox mixing a VM and a container is made
// through each kind's own API (the container cloned from a container
// template, configured with the sandbox's tags, hostname and vnet,
// started), the container's inside is reached through CTGuests (never a
// VM agent's socket) and gets the secrets file, the answer says which
// member is a container; its delete removes each through its own API, and
// a restarted engine knows the container from its state file.
func TestContainerMember(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	e := b.engine(t)
	sb, err := e.Create(ctx, mixed())
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.VMs) != 2 || sb.VMs[0].Kind != "" || sb.VMs[1].Kind != apitype.KindLXC {
		t.Fatalf("members %+v", sb.VMs)
	}
	ct := sb.VMs[1]
	info, err := b.cts.CT(ctx, ct.VMID)
	if err != nil || info.Status != "running" || info.Pool != "pve-inspect" || !strings.Contains(strings.Join(info.Tags, ";"), sb.ID) {
		t.Errorf("container %d: %+v, %v", ct.VMID, info, err)
	}
	if _, err := b.p.VM(ctx, ct.VMID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the container is seen as a VM: %v", err)
	}
	conf, _ := b.cts.CTConfigValues(ctx, ct.VMID)
	if conf["hostname"] != "pvei-"+sb.ID+"-target" || conf["net0"] != "name=eth0,bridge="+sb.Networks[0].VNet+",ip=dhcp" || conf["swap"] != "0" || conf["memory"] != "256" {
		t.Errorf("container config %v", conf)
	}
	if b.entered.Load() == 0 {
		t.Error("the container's inside was never reached through CTGuests")
	}
	if env, ok := b.g.File(ct.VMID, apitype.GuestEnvPath); !ok || !strings.Contains(string(env), "API_KEY=") {
		t.Errorf("secrets file in the container: %q, %v", env, ok)
	}
	if b.g.Hostname(ct.VMID) != "target" {
		t.Errorf("container's hostname %q", b.g.Hostname(ct.VMID))
	}
	before := b.entered.Load()
	if _, err := e.Guest(sb.VMs[0].VMID).Exec(ctx, sandbox.GuestExec{Argv: []string{"echo", "hi"}}); err != nil {
		t.Fatal(err)
	}
	if b.entered.Load() != before {
		t.Error("the VM's guest was reached through CTGuests")
	}

	// a restarted engine reads the container's kind back and deletes it
	// through the container API
	e2 := b.engine(t)
	got, ok := e2.Get(sb.ID)
	if !ok || got.State != apitype.StateReady || got.VMs[1].Kind != apitype.KindLXC {
		t.Fatalf("after restart: %+v, %v", got, ok)
	}
	if err := e2.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if ids := b.p.VMIDs(); len(ids) != 0 {
		t.Errorf("left after delete: %v", ids)
	}
	if b.p.Calls["DeleteCT"] != 1 || b.p.Calls["DeleteVM"] != 1 {
		t.Errorf("deletes: %d CT, %d VM", b.p.Calls["DeleteCT"], b.p.Calls["DeleteVM"])
	}
}

// TestContainerRefusals: a container template, or a fresh clone, that is
// privileged, has feature flags (nesting), a mount point, a device or a
// raw lxc key is refused before anything of the sandbox is made (the
// template) or the create fails and leaves nothing (the clone); an engine
// without a container API refuses kind lxc (the warm pool's containers:
// poolct_test.go).
func TestContainerRefusals(t *testing.T) {
	ctx := context.Background()
	with := func(k, v string) map[string]string {
		c := map[string]string{}
		for key, val := range ctConf {
			c[key] = val
		}
		if v == "" {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	for _, tc := range []struct {
		name string
		conf map[string]string
		want string
	}{
		{"privileged", with("unprivileged", "0"), "privileged"},
		{"unprivileged unset", with("unprivileged", ""), "privileged"},
		{"nesting", with("features", "nesting=1"), "feature flags nesting=1"},
		{"keyctl", with("features", "keyctl=1"), "feature flags keyctl=1"},
		{"mount point", with("mp0", "/srv/data,mp=/data"), "mp0"},
		{"device", with("dev0", "/dev/kvm"), "dev0"},
		{"raw lxc key", with("lxc.apparmor.profile", "unconfined"), "lxc.apparmor.profile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newCTBench(t, tc.conf)
			e := b.engine(t)
			_, err := e.Create(ctx, mixed())
			var nh *sandbox.NotHardenedError
			if !errors.As(err, &nh) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v, want a refusal naming %q", err, tc.want)
			}
			if ids := b.p.VMIDs(); len(ids) != 0 || b.p.Calls["CloneVM"]+b.p.Calls["CloneCT"] != 0 {
				t.Errorf("made before the refusal: %v, %d clones", ids, b.p.Calls["CloneVM"]+b.p.Calls["CloneCT"])
			}
			if zones, _, _ := b.p.SDNObjects(); zones != 0 {
				t.Errorf("%d zones made", zones)
			}
		})
	}
	t.Run("clone changed before its check", func(t *testing.T) {
		b := newCTBench(t, ctConf)
		// the template passes; the clone's config gains nesting between
		// its configure and its check
		b.o.Containers = nestingAfterConfigure{CTs: b.cts}
		e := b.engine(t)
		_, err := e.Create(ctx, mixed())
		var nh *sandbox.NotHardenedError
		if !errors.As(err, &nh) || !strings.Contains(err.Error(), "nesting") {
			t.Fatalf("create: %v, want the clone refused", err)
		}
		if ids := b.p.VMIDs(); len(ids) != 0 {
			t.Errorf("left after the failed create: %v", ids)
		}
	})
	t.Run("no container API", func(t *testing.T) {
		e := newEngine(t, nil)
		if _, err := e.Create(ctx, mixed()); !errors.Is(err, sandbox.ErrNotConfigured) {
			t.Errorf("create: %v, want ErrNotConfigured", err)
		}
	})
}

// nestingAfterConfigure is a container API whose configure also turns
// nesting on (another hand changing the clone's config).
type nestingAfterConfigure struct {
	*apitest.CTs
}

func (n nestingAfterConfigure) ConfigureCT(ctx context.Context, id int, c sandbox.CTConfig) error {
	if err := n.CTs.ConfigureCT(ctx, id, c); err != nil {
		return err
	}
	n.SetConfig(id, "features", "nesting=1")
	return nil
}

// TestContainerOrphanReconciled: a container tagged for this node whose
// sandbox the state file does not know (the file lost) is removed at
// start through the container API, as an orphan VM is.
func TestContainerOrphanReconciled(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	e := b.engine(t)
	if _, err := e.Create(ctx, mixed()); err != nil {
		t.Fatal(err)
	}
	b.o.StateDir = t.TempDir() // the state file lost
	e2, err := sandbox.New(b.o)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := e2.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids := b.p.VMIDs(); len(ids) != 0 || len(rep.OrphanVMs) != 2 || b.p.Calls["DeleteCT"] != 1 {
		t.Errorf("left %v; orphans removed %v; %d container deletes", ids, rep.OrphanVMs, b.p.Calls["DeleteCT"])
	}
}

// TestContainerCheck: the containment check runs from a container as
// from a VM: its target is the container member, and its Guest is the
// container entered from the node (CTGuests), never an agent socket.
func TestContainerCheck(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	var got []sandbox.CheckTarget
	b.o.Checker = checkerFunc(func(_ context.Context, ct sandbox.CheckTarget) (apitype.CheckReport, error) {
		got = append(got, ct)
		return apitype.CheckReport{Pass: true}, nil
	})
	e := b.engine(t)
	sb, err := e.Create(ctx, mixed())
	if err != nil {
		t.Fatal(err)
	}
	entered := b.entered.Load()
	rep, err := e.Check(ctx, sb, sb.VMs[1])
	if err != nil || !rep.Pass || rep.VM != "target" {
		t.Fatalf("check from the container: %+v, %v", rep, err)
	}
	if len(got) != 1 || got[0].VM.Kind != apitype.KindLXC || got[0].VM.VMID != sb.VMs[1].VMID || got[0].Guest == nil {
		t.Fatalf("check target %+v", got)
	}
	if b.entered.Load() != entered+1 {
		t.Errorf("the container's guest was not the one CTGuests enters (%d entries, had %d)", b.entered.Load(), entered)
	}
	if _, err := e.Check(ctx, sb, sb.VMs[0]); err != nil || len(got) != 2 || got[1].VM.Kind == apitype.KindLXC {
		t.Errorf("check from the VM: %v (targets %+v)", err, got)
	}
}

type checkerFunc func(context.Context, sandbox.CheckTarget) (apitype.CheckReport, error)

func (f checkerFunc) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	return f(ctx, t)
}
