package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestReviewRawLXCKeyAsProxmoxReturnsIt: pve-container's GET
// .../lxc/{vmid}/config returns a config's raw lxc.* lines as ONE key
// "lxc", an array of [key, value] pairs (API2/LXC/Config.pm vm_config:
// returns.properties.lxc; LXC/Config.pm parse_pct_config pushes every raw
// key onto $conf->{lxc}); pveapi.CTConfigValues passes it through
// configText (fmt.Sprint), so the engine sees
// conf["lxc"] = "[[lxc.apparmor.profile unconfined]]" and never a key
// starting "lxc.". clone_vm copies it into every clone ("copy everything
// else"). The daemon's rule (README: "refuses ... a raw lxc.* key")
// refuses such a template (it looked for keys starting "lxc." and never
// saw them; found by a review).
func TestReviewRawLXCKeyAsProxmoxReturnsIt(t *testing.T) {
	ctx := context.Background()
	for _, raw := range []string{
		"[[lxc.apparmor.profile unconfined]]",
		"[[lxc.mount.entry /root host-root none bind,create=dir 0 0]]",
		"[[lxc.cgroup2.devices.allow a]]",
	} {
		t.Run(raw, func(t *testing.T) {
			conf := map[string]string{}
			for k, v := range ctConf {
				conf[k] = v
			}
			conf["lxc"] = raw
			b := newCTBench(t, conf)
			e := b.engine(t)
			_, err := e.Create(ctx, mixed())
			var nh *sandbox.NotHardenedError
			if !errors.As(err, &nh) {
				t.Fatalf("create from a template with raw lxc keys %s: %v, want a NotHardenedError", raw, err)
			}
		})
	}
}

// lockingCTs models pve-container's clone_vm: the source (the template)
// gets "lock: disk" in the request (AbstractConfig set_lock: check_lock
// dies "CT is locked (disk)" when it already has one) and keeps it until
// the vzclone worker ends (remove_lock after vdisk_clone, mount_all and
// post_clone_hook). The emulator models the same (pveemu lxcclone.go).
type lockingCTs struct {
	*apitest.CTs
	mu     sync.Mutex
	locked map[int]bool
}

func (c *lockingCTs) CloneCT(ctx context.Context, s sandbox.CloneSpec) error {
	c.mu.Lock()
	if c.locked[s.Template] {
		c.mu.Unlock()
		return errors.New("clone CT: 500 CT is locked (disk)")
	}
	c.locked[s.Template] = true
	c.mu.Unlock()
	defer func() { c.mu.Lock(); delete(c.locked, s.Template); c.mu.Unlock() }()
	// the new id's config exists from the request on
	// (create_and_lock_config); the template stays locked until the
	// vzclone worker ends
	err := c.CTs.CloneCT(ctx, s)
	time.Sleep(300 * time.Millisecond)
	return err
}

// TestReviewTwoContainersOfOneTemplate: a sandbox with two containers of
// one template (targets of a range), or two tenants' creates at once,
// clone the template concurrently, which pve-container refuses ("CT is
// locked (disk)") while another clone of it runs: the engine clones one
// template one clone at a time and tries a refused clone again (it did
// neither, and the create failed; found by a review).
func TestReviewTwoContainersOfOneTemplate(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	lc := &lockingCTs{CTs: b.cts, locked: map[int]bool{}}
	b.o.Containers = lc
	e := b.engine(t)
	req := oneVM("debian")
	req.VMs = []apitype.VMRequest{
		{Name: "t1", Kind: apitype.KindLXC, Template: "ct-debian", Cores: 1, MemoryMiB: 256, Networks: []string{"net0"}},
		{Name: "t2", Kind: apitype.KindLXC, Template: "ct-debian", Cores: 1, MemoryMiB: 256, Networks: []string{"net0"}},
	}
	if _, err := e.Create(ctx, req); err != nil {
		t.Fatalf("a sandbox of two containers of one template: %v", err)
	}
}

// TestReviewKindOfStaleRecord: kindOf picks a member's kind from the
// records, the first record not being deleted that holds the id, in map
// order. A sandbox whose delete failed after its container was destroyed
// (state error: here the zone's delete fails) keeps the container's id;
// the next create takes that id for a VM. Guest(id) of the new sandbox's
// VM must never be taken for a container (nor a snapshot, rollback or
// upload sent to the container API): a failed teardown drops the ids of
// the members it removed from the record (found by a review).
func TestReviewKindOfStaleRecord(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	e := b.engine(t)
	ctOnly := oneVM("debian")
	ctOnly.VMs = []apitype.VMRequest{{Name: "t1", Kind: apitype.KindLXC, Template: "ct-debian", Cores: 1, MemoryMiB: 256, Networks: []string{"net0"}}}
	a, err := e.Create(ctx, ctOnly)
	if err != nil {
		t.Fatal(err)
	}
	ctID := a.VMs[0].VMID
	b.p.Fail("DeleteZone", errors.New("zone delete refused"))
	if err := e.Delete(ctx, a.ID); err == nil {
		t.Fatal("delete did not fail")
	}
	b.p.Fail("DeleteZone", nil)
	if got, _ := e.Get(a.ID); got.State == apitype.StateDeleting {
		t.Fatalf("a is %s", got.State)
	}
	if _, err := b.cts.CT(ctx, ctID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("container %d still there: %v", ctID, err)
	}
	vmSb, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	if vmSb.VMs[0].VMID != ctID {
		t.Skipf("the VM got id %d, not the freed %d", vmSb.VMs[0].VMID, ctID)
	}
	wrong := 0
	for range 64 {
		before := b.entered.Load()
		_, _ = e.Guest(ctID).Exec(ctx, sandbox.GuestExec{Argv: []string{"true"}})
		if b.entered.Load() != before {
			wrong++
		}
	}
	if wrong > 0 {
		t.Errorf("sandbox %s's VM %d was entered as a container %d of 64 times (kindOf took %s's stale record, state %s)",
			vmSb.ID, ctID, wrong, a.ID, func() string { g, _ := e.Get(a.ID); return g.State }())
	}
}

// TestReviewContainersTurnedOff: an operator sets [api] containers =
// false while sandboxes with containers exist: the restarted engine makes
// no container but still deletes those it has (the daemon keeps the
// container API; it could not, and they kept running; found by a review).
func TestReviewContainersTurnedOff(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	e := b.engine(t)
	sb, err := e.Create(ctx, mixed())
	if err != nil {
		t.Fatal(err)
	}
	ctID := sb.VMs[1].VMID
	b.o.CTGuests = nil // [api] containers = false: the daemon keeps the container API
	e2 := b.engine(t)
	err = e2.Delete(ctx, sb.ID)
	if info, cerr := b.cts.CT(ctx, ctID); cerr == nil {
		t.Errorf("delete with containers turned off: %v; container %d left %s", err, ctID, info.Status)
	}
}
