package sandboxapi_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// hookedProxmox calls onVM before every VM lookup (the first call of a VM's
// delete).
type hookedProxmox struct {
	*apitest.Proxmox
	mu   sync.Mutex
	onVM func(id int)
}

func (h *hookedProxmox) VM(ctx context.Context, id int) (sandbox.VMInfo, error) {
	h.mu.Lock()
	f := h.onVM
	h.mu.Unlock()
	if f != nil {
		f(id)
	}
	return h.Proxmox.VM(ctx, id)
}

func (h *hookedProxmox) hook(f func(int)) {
	h.mu.Lock()
	h.onVM = f
	h.mu.Unlock()
}

// hooked builds an env whose Proxmox calls hooks.
func hooked(t *testing.T, mod func(*options)) (*env, *hookedProxmox) {
	g := apitest.NewGuests()
	hp := &hookedProxmox{Proxmox: apitest.NewProxmox(g, templates())}
	e := newEnvOn(t, hp.Proxmox, g, t.TempDir(), func(o *options) {
		o.Proxmox = hp
		if mod != nil {
			mod(o)
		}
	})
	return e, hp
}

// TestReaperRace: a sandbox extended while it waits in the reaper's list
// (the reaper busy deleting another: one at a time here, so the second
// waits) is kept: the caller was told 200 with a new expiry.
func TestReaperRace(t *testing.T) {
	e, hp := hooked(t, func(o *options) { o.ReapParallel = 1 })
	ctx := e.ctx()
	req := twoVMs()
	req.TTLSeconds = 60
	a, b := e.create(req), e.create(req)
	owner := map[int]apitype.Sandbox{}
	for _, sb := range []apitype.Sandbox{a, b} {
		for _, v := range sb.VMs {
			owner[v.VMID] = sb
		}
	}
	e.clock.Advance(2 * time.Minute) // both expired

	hit := make(chan int, 1)
	release := make(chan struct{})
	var once sync.Once
	hp.hook(func(id int) {
		once.Do(func() { hit <- id; <-release })
	})
	reaped := make(chan int, 1)
	go func() { reaped <- e.srv.Engine().Reap(ctx) }()
	var first int
	select {
	case first = <-hit:
	case <-time.After(30 * time.Second):
		t.Fatal("the reaper never started deleting")
	}
	// The reaper holds the first sandbox's delete; extend the other one.
	other := a
	if owner[first].ID == a.ID {
		other = b
	}
	ext, err := e.c.Extend(ctx, other.ID, time.Hour)
	close(release)
	if err != nil {
		t.Fatalf("extend while waiting in the reaper's list: %v", err)
	}
	if n := <-reaped; n != 1 {
		t.Errorf("reaper deleted %d sandboxes, want 1", n)
	}
	got, err := e.c.Get(ctx, other.ID)
	if err != nil || got.State != apitype.StateReady || !got.ExpiresAt.Equal(ext.ExpiresAt) {
		t.Fatalf("extended sandbox after the reaper: %+v %v (told expiry %s)", got, err, ext.ExpiresAt)
	}
	for _, v := range other.VMs {
		if _, ok := e.px.VMByID(v.VMID); !ok {
			t.Errorf("VM %d of the extended sandbox deleted", v.VMID)
		}
	}
}

// countingGuest counts the exec calls in flight, and says on started when
// one of the test's own command ("sleep") began: the engine's calls (a
// create names each guest through an exec) do not count as its start.
type countingGuest struct {
	sandbox.Guest
	inflight *atomic.Int32
	started  chan<- struct{}
}

func (g countingGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	g.inflight.Add(1)
	defer g.inflight.Add(-1)
	if len(r.Argv) > 0 && r.Argv[0] == "sleep" {
		select {
		case g.started <- struct{}{}:
		default:
		}
	}
	return g.Guest.Exec(ctx, r)
}

// TestDeleteCancelsInFlight: a delete cancels the sandbox's guest calls in
// flight and waits for them before it touches any VM; the cancelled call
// answers a conflict.
func TestDeleteCancelsInFlight(t *testing.T) {
	var inflight atomic.Int32
	started := make(chan struct{}, 1)
	e, hp := hooked(t, func(o *options) {
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest {
			return countingGuest{Guest: dial(p), inflight: &inflight, started: started}
		}
	})
	ctx := e.ctx()
	sb := e.create(twoVMs())
	var atDelete []int32
	var mu sync.Mutex
	hp.hook(func(int) {
		mu.Lock()
		atDelete = append(atDelete, inflight.Load())
		mu.Unlock()
	})
	execErr := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(ctx, sb.ID, "a", apitype.ExecRequest{Argv: []string{"sleep"}, TimeoutSeconds: 3600})
		execErr <- err
	}()
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("exec never started")
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-execErr:
		if !client.IsProblem(err, apitype.ProblemConflict) {
			t.Errorf("exec cut by the delete answered %v, want a conflict", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("exec still running after the delete")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(atDelete) == 0 {
		t.Fatal("the delete never looked at a VM")
	}
	for _, n := range atDelete {
		if n != 0 {
			t.Fatalf("a VM was touched with %d exec calls still in flight (%v)", n, atDelete)
		}
	}
}
