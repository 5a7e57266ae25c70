package e2e_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// The health monitor's timing in the bed; the documented bound of a
// verdict is AgentBrokenAfter (agent silence) plus two rounds and two
// ping timeouts.
const (
	bedHealthInterval    = time.Second
	bedAgentBrokenAfter  = 6 * time.Second
	bedPingTimeout       = 2 * time.Second
	bedHealthVerdictTime = bedAgentBrokenAfter + 2*bedHealthInterval + 2*bedPingTimeout
)

// eventLog follows the event stream for the whole test.
type eventLog struct {
	mu  sync.Mutex
	evs []apitype.Event
}

func (l *eventLog) find(sb, typ, reason string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.evs {
		if e.Sandbox == sb && e.Type == typ && (reason == "" || e.Health != nil && e.Health.Reason == reason) {
			return true
		}
	}
	return false
}

// guestPIDs returns the pids in guest vmid's namespace whose command is
// comm.
func guestPIDs(t *testing.T, e *bedEnv, vmid int, comm string) []int {
	t.Helper()
	g, ok := e.bed.Guest(vmid)
	if !ok {
		t.Fatalf("no guest %d", vmid)
	}
	out, err := exec.Command("ip", "netns", "pids", g.NS).Output()
	if err != nil {
		t.Fatalf("ip netns pids: %v", err)
	}
	var pids []int
	for _, p := range strings.Fields(string(out)) {
		b, _ := os.ReadFile("/proc/" + p + "/comm")
		if strings.TrimSpace(string(b)) == comm {
			pid, _ := strconv.Atoi(p)
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestBedHealth: on the node in a box, with the real qemu-ga in every
// guest and the real cgroup and tap layout, each way of breaking a sandbox
// turns its health to the right state and reason within the documented
// time, the change arrives on the event stream, and an exec on a broken VM
// fails at once with sandbox-broken; a sandbox under CPU load stays ok and
// its host-side counters move.
// newHealthBedEnv is a bed env whose engine's health monitor reads the
// bed's cgroups and the node's taps and runs, every bedHealthInterval,
// until the test ends.
func newHealthBedEnv(t *testing.T, ctx context.Context) *bedEnv {
	t.Helper()
	e := newBedEnv(t, ctx, func(o *options) {
		o.Health = sandbox.HealthOptions{Interval: bedHealthInterval, AgentBrokenAfter: bedAgentBrokenAfter, PingTimeout: bedPingTimeout}
	})
	sysfs, err := e.bed.NodeNetSys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The health part reads the bed's cgroups and the node's taps: restart
	// the engine with them (the bed exists only after newBedEnv).
	e.opts.Health.Node = sandbox.NodeReader{CgroupRoot: e.bed.CgroupRoot(), Parent: e.bed.CgroupParent(), NetRoot: filepath.Join(sysfs, "class", "net")}
	e.start(t, ctx)
	hctx, hcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.srv.Engine().RunHealth(hctx) }()
	t.Cleanup(func() { hcancel(); <-done })
	return e
}

func TestBedHealth(t *testing.T) {
	testkit.RequireRoot(t, "nsenter", "mount", "losetup", "mkfs.ext4")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newHealthBedEnv(t, ctx)
	hctx, hcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer hcancel()
	wg.Add(1)
	log := &eventLog{}
	go func() {
		defer wg.Done()
		_ = e.c.Events(hctx, client.EventsRequest{Resume: true}, func(ev apitype.Event) error {
			log.mu.Lock()
			log.evs = append(log.evs, ev)
			log.mu.Unlock()
			return nil
		})
	}()
	root := rootClient(t, e.emu, e.url, e.hc, "health")

	create := func(t *testing.T, memMiB int) apitype.Sandbox {
		t.Helper()
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", MemoryMiB: memMiB}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(ctx), sb.ID) })
		return sb
	}
	// waitHealth polls the sandbox until its health is state/reason.
	waitHealth := func(t *testing.T, sb apitype.Sandbox, within time.Duration, state, reason string) apitype.SandboxHealth {
		t.Helper()
		start := time.Now()
		var h *apitype.SandboxHealth
		for time.Since(start) < within {
			got, err := e.c.Get(ctx, sb.ID)
			if err == nil && got.Health != nil && got.Health.State == state && got.Health.Reason == reason {
				t.Logf("%s/%s after %s: %s", state, reason, time.Since(start).Round(100*time.Millisecond), got.Health.Detail)
				return *got.Health
			}
			h = got.Health
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("health after %s: %+v, want %s/%s", within, h, state, reason)
		return apitype.SandboxHealth{}
	}
	waitEvent := func(t *testing.T, sb apitype.Sandbox, reason string) {
		t.Helper()
		for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(100 * time.Millisecond) {
			if log.find(sb.ID, apitype.EventHealth, reason) {
				return
			}
		}
		t.Errorf("no health event %s for %s on the stream", reason, sb.ID)
	}
	execBroken := func(t *testing.T, sb apitype.Sandbox, reason string) {
		t.Helper()
		start := time.Now()
		_, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"true"}})
		var p *apitype.Problem
		if !errors.As(err, &p) || p.Type != apitype.ProblemSandboxBroken || p.Reason != reason {
			t.Errorf("exec on the broken VM: %v, want sandbox-broken (%s)", err, reason)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("the refusal took %s", d)
		}
	}

	t.Run("healthy under load stays ok", func(t *testing.T) {
		sb := create(t, 0)
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
		before, _ := e.c.Get(ctx, sb.ID)
		res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sh", "-c",
			"p=; for i in 1 2 3; do (while :; do :; done) & p=\"$p $!\"; done; sleep 12; kill $p"}, TimeoutSeconds: 60})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("load: %+v %v", res, err)
		}
		after := waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
		if log.find(sb.ID, apitype.EventHealth, "") {
			t.Error("a health event for a healthy sandbox under load")
		}
		b, a := before.Health.VMs[0].Host, after.VMs[0].Host
		if a.CPUSeconds < b.CPUSeconds+2 || a.MemoryBytes == 0 || a.NetPacketsFromGuest == 0 || len(a.Missing) != 0 {
			t.Errorf("host signals did not follow the load: before %+v after %+v", b, a)
		}
		// qemu-ga reports block-device filesystems only: the bed's overlay
		// root is none, so the report is there but empty (the disk test
		// below mounts one).
		if gr := after.VMs[0].GuestReported; gr == nil || gr.Error != "" {
			t.Errorf("no guest report: %+v", gr)
		}
	})

	t.Run("agent killed", func(t *testing.T) {
		sb := create(t, 0)
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
		pids := guestPIDs(t, e, sb.VMs[0].VMID, "qemu-ga")
		if len(pids) != 1 {
			t.Fatalf("qemu-ga pids %v", pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthBroken, apitype.ReasonAgentUnresponsive)
		waitEvent(t, sb, apitype.ReasonAgentUnresponsive)
		execBroken(t, sb, apitype.ReasonAgentUnresponsive)
	})

	t.Run("vm stopped behind the daemon's back", func(t *testing.T) {
		sb := create(t, 0)
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
		if err := root.StopVM(ctx, sb.VMs[0].VMID); err != nil {
			t.Fatal(err)
		}
		waitHealth(t, sb, 2*bedHealthInterval+2*bedPingTimeout, apitype.HealthBroken, apitype.ReasonVMStopped)
		waitEvent(t, sb, apitype.ReasonVMStopped)
		execBroken(t, sb, apitype.ReasonVMStopped)
	})

	t.Run("disk filled", func(t *testing.T) {
		sb := create(t, 0)
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
		// A small data disk in the guest (the bed's root is an overlay on
		// the machine's own disk, too big to fill), mounted in the
		// guest's mount namespace from the host.
		vmid := sb.VMs[0].VMID
		pids := guestPIDs(t, e, vmid, "qemu-ga")
		if len(pids) != 1 {
			t.Fatalf("qemu-ga pids %v", pids)
		}
		mnt := filepath.Join(e.bed.Dir(), "guests", strconv.Itoa(vmid), "root", "mnt")
		img := filepath.Join(e.bed.Dir(), "datadisk.img")
		for _, argv := range [][]string{{"truncate", "-s", "16M", img}, {"mkfs.ext4", "-q", "-m", "0", img}} {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v %s", argv, err, out)
			}
		}
		loop, err := exec.Command("losetup", "-f", "--show", img).Output()
		if err != nil {
			t.Fatalf("losetup: %v", err)
		}
		dev := strings.TrimSpace(string(loop))
		t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
		if out, err := exec.Command("nsenter", "-t", strconv.Itoa(pids[0]), "-m", "mount", dev, mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount the data disk: %v %s", err, out)
		}
		res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sh", "-c", "dd if=/dev/zero of=/mnt/fill bs=1M count=64 2>&1; df /mnt"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fill: exit %d %s", res.ExitCode, res.Stdout)
		if got, err := e.c.Get(ctx, sb.ID); err == nil && got.Health != nil && got.Health.VMs[0].GuestReported != nil {
			t.Logf("guest-reported: %+v", *got.Health.VMs[0].GuestReported)
		}
		h := waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthDegraded, apitype.ReasonGuestDiskFull)
		if !strings.Contains(h.Detail, "/mnt") || !strings.Contains(h.Detail, "guest-reported") {
			t.Errorf("detail %q", h.Detail)
		}
		waitEvent(t, sb, apitype.ReasonGuestDiskFull)
		if res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"rm", "/mnt/fill"}}); err != nil || res.ExitCode != 0 {
			t.Errorf("a degraded VM still runs calls: %+v %v", res, err)
		}
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
	})

	t.Run("memory exhausted", func(t *testing.T) {
		sb := create(t, 256)
		waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthOK, "")
		res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sh", "-c", "head -c 1G /dev/zero | tail -c 900M > /dev/null"}, TimeoutSeconds: 60})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("allocation: exit %d %q", res.ExitCode, res.Stderr)
		h := waitHealth(t, sb, bedHealthVerdictTime, apitype.HealthDegraded, apitype.ReasonOOMKill)
		if h.VMs[0].Host.OOMKills == 0 || h.VMs[0].Host.MemoryPeakBytes < 200<<20 {
			t.Errorf("host signals %+v", h.VMs[0].Host)
		}
		waitEvent(t, sb, apitype.ReasonOOMKill)
		if res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", "alive"}}); err != nil || string(res.Stdout) != "alive\n" {
			t.Errorf("a degraded VM still runs calls: %+v %v", res, err)
		}
	})
}
