package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// holdFreeze is the bed's backend with a snapshot's frozen window held
// open until the test releases it: the emulator freezes the agent (the
// bed's proxy, no real fsfreeze), then SetAgentFrozen waits.
type holdFreeze struct {
	pveemu.BedBackend
	frozen  chan int
	release chan struct{}
}

func (h *holdFreeze) SetAgentFrozen(vmid int, frozen bool) error {
	if err := h.BedBackend.SetAgentFrozen(vmid, frozen); err != nil || !frozen {
		return err
	}
	h.frozen <- vmid
	select {
	case <-h.release:
	case <-time.After(2 * time.Minute):
	}
	return nil
}

// TestBedSnapshotFrozenAgent: while a snapshot of a running sandbox VM
// holds its agent frozen (qemu-ga's frozen state, emulated by the bed's
// proxy in front of the real qemu-ga), an exec, a file write and a file
// read get a clear, retryable 409 conflict naming the frozen file
// systems, never a 500; the health stays ok (guest-ping is allowed while
// frozen); after the snapshot everything works again.
func TestBedSnapshotFrozenAgent(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h := &holdFreeze{frozen: make(chan int, 1), release: make(chan struct{})}
	e := newBedEnvWith(t, ctx, func(b pveemu.BedBackend) pveemu.Backend { h.BedBackend = b; return h }, func(o *options) {
		o.Health = sandbox.HealthOptions{Interval: bedHealthInterval, AgentBrokenAfter: bedAgentBrokenAfter, PingTimeout: bedPingTimeout}
	})
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(ctx), sb.ID) })
	hctx, hcancel := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() { defer close(healthDone); e.srv.Engine().RunHealth(hctx) }()
	defer func() { hcancel(); <-healthDone }()

	snapErr := make(chan error, 1)
	go func() { snapErr <- e.c.Snapshot(ctx, sb.ID, "vm0", "s1") }()
	select {
	case <-h.frozen:
	case err := <-snapErr:
		t.Fatalf("the snapshot ended without freezing the agent: %v", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	defer release()

	conflict := func(what string, err error) {
		t.Helper()
		var p *apitype.Problem
		if !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "frozen for a snapshot: retry when it ends") {
			t.Errorf("%s while frozen: %v (%+v), want a 409 conflict naming the frozen file systems", what, err, p)
		}
	}
	_, err = e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"true"}})
	conflict("exec", err)
	err = e.c.WriteFile(ctx, sb.ID, "vm0", "/root/f", bytes.NewReader([]byte("x")), 1, 0o600)
	conflict("file write", err)
	_, err = e.c.ReadFile(ctx, sb.ID, "vm0", "/etc/hostname", io.Discard)
	conflict("file read", err)
	// three health rounds inside the frozen window
	time.Sleep(3 * bedHealthInterval)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Health == nil || got.Health.State != apitype.HealthOK {
		t.Errorf("health while frozen: %+v, want ok", got.Health)
	}

	release()
	if err := <-snapErr; err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", "thawed"}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "thawed" {
		t.Fatalf("exec after the snapshot: %+v %v", res, err)
	}
}
