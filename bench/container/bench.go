// Package container measures the second kind of sandbox member against
// the first on the test bed, in one run and side by side: a sandbox of
// one unprivileged container (pve-container's layout: a real LXC
// container, entered by ctguest) against a sandbox of one VM (the bed's
// VM: a namespace with the real qemu-ga) of the same shape (1 core,
// 512 MiB, one auto network), through the HTTP API on the Proxmox
// emulator: cold create-to-ready (p50, p99), exec round trip through the
// API and at the guest call (ctguest against the guest agent client;
// p50, p99), a claim from the warm pool (a shape of kind lxc against a VM
// shape, each of the cold create's template and shape; p50, p99), and the
// memory of an idle member on the node (its cgroup's memory.current, or the v1
// memory.usage_in_bytes of a hybrid host), with the goals: a
// container's cold create under 1 s on the bed, an idle container under
// 32 MiB. Needs root (the bed, lxc).
package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/ctguest"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// Options size a run; zero values take the defaults.
type Options struct {
	// Rounds is how many cold creates of each kind are timed (20).
	Rounds int
	// Execs is how many execs of each kind are timed, through the API
	// and at the guest call each (100).
	Execs int
	// Claims is how many claims from each kind's pool are timed (10).
	Claims int
	// Idle is how many members of each kind idle while their memory is
	// read (3); Settle how long they idle first (10 s).
	Idle   int
	Settle time.Duration
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Rounds, 20)
	def(&o.Execs, 100)
	def(&o.Claims, 10)
	def(&o.Idle, 3)
	if o.Settle <= 0 {
		o.Settle = 10 * time.Second
	}
}

// Kind is one kind's figures.
type Kind struct {
	// Cold are the cold creates' create-to-ready times.
	Cold []time.Duration
	// ExecAPI are exec round trips of argv true through the HTTP API,
	// ExecGuest the same at the engine's guest call (ctguest, or the guest
	// agent client).
	ExecAPI, ExecGuest []time.Duration
	// Claims are create-to-ready times of claims from the warm pool.
	Claims []time.Duration
	// IdleMemory is each idle member's memory on the node, in bytes.
	IdleMemory []uint64
}

// Result holds one run's figures.
type Result struct {
	Container, VM Kind
	// Settle is how long the members idled before their memory was read.
	Settle time.Duration
}

// The goals of issue 38 on the bed.
const (
	// ColdGoal: a container's cold create-to-ready.
	ColdGoal = time.Second
	// IdleMemoryGoal: an idle container's memory on the node.
	IdleMemoryGoal = 32 << 20
)

// The shape both kinds are made in, and the templates.
const (
	cores, memoryMiB = 1, 512
	vmTemplate       = "debian"
	ctTemplate       = "ct-debian"
	ctTemplateID     = 9100
)

// Run brings a bed up, measures, prints the figures to w and tears down.
func Run(ctx context.Context, o Options, w io.Writer) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("containerbench: needs root (the test bed)")
	}
	o.defaults()
	node, err := bench.NewEmuNode(ctx)
	if err != nil {
		return nil, err
	}
	defer node.Close()
	r, err := newRunner(ctx, node)
	if err != nil {
		return nil, err
	}
	defer r.close()
	res := &Result{Settle: o.Settle}
	if err := r.warmUp(); err != nil {
		return nil, err
	}
	if err := r.cold(o.Rounds, res); err != nil {
		return nil, err
	}
	if err := r.idleAndExec(o, res); err != nil {
		return nil, err
	}
	if err := r.claims(o.Claims, res); err != nil {
		return nil, err
	}
	res.Print(w)
	return res, nil
}

// runner is one run's engine, API and node readers.
type runner struct {
	ctx   context.Context
	node  *bench.EmuNode
	eng   *sandbox.Engine
	c     *client.Client
	stats sandbox.NodeReader
	close func()
}

func newRunner(ctx context.Context, node *bench.EmuNode) (*runner, error) {
	rootfs, err := testvm.CTRootfs(ctx)
	if err != nil {
		return nil, fmt.Errorf("containerbench: container root: %w", err)
	}
	if err := node.Emu.AddCTTemplate(ctTemplateID, ctTemplate, rootfs, map[string]string{"net0": "name=eth0,bridge=vmbr0,ip=dhcp"}); err != nil {
		return nil, err
	}
	sysfs, err := node.Bed.NodeNetSys(ctx)
	if err != nil {
		return nil, err
	}
	cts := ctguest.New(ctguest.Options{LXCPath: node.Bed.LXCPath(), Prefix: node.Bed.LXCPrefix(), CgroupDir: node.Bed.ContainerCgroupV2})
	eng, err := sandbox.New(sandbox.Options{
		Node: "pve", Proxmox: node.PX, Guests: node.QGA.SandboxGuests(), QGADir: node.Bed.QGADir(),
		Containers: node.PX, CTGuests: func(vmid int) sandbox.Guest { return cts.Guest(vmid) }, CTSweep: cts.Sweep,
		StateDir: filepath.Join(node.Bed.Dir(), "container-bench-state"), Logger: slog.New(slog.DiscardHandler),
		WarmPool: []sandbox.PoolShape{{Name: "small", Template: vmTemplate, Cores: cores, MemoryMiB: memoryMiB, Target: 1},
			{Name: "small-ct", Kind: apitype.KindLXC, Template: ctTemplate, Cores: cores, MemoryMiB: memoryMiB, Target: 1}},
		PoolInterval: time.Hour,
	})
	if err != nil {
		return nil, err
	}
	c, closeAPI, err := bench.Serve(ctx, eng, sandboxapi.Options{})
	if err != nil {
		return nil, err
	}
	return &runner{ctx: ctx, node: node, eng: eng, c: c, close: closeAPI,
		stats: sandbox.NodeReader{CgroupRoot: node.Bed.CgroupRoot(), Parent: node.Bed.CgroupParent(), NetRoot: filepath.Join(sysfs, "class", "net")}}, nil
}

// request is a one-member sandbox of kind ("" a VM, apitype.KindLXC).
func request(kind string) apitype.CreateRequest {
	v := apitype.VMRequest{Name: "m", Template: vmTemplate, Cores: cores, MemoryMiB: memoryMiB}
	if kind == apitype.KindLXC {
		v.Kind, v.Template = apitype.KindLXC, ctTemplate
	}
	return apitype.CreateRequest{VMs: []apitype.VMRequest{v}}
}

// create makes a sandbox of kind and times it; claim says whether it
// must come from the pool (otherwise it must not).
func (r *runner) create(kind string, claim bool) (apitype.Sandbox, time.Duration, error) {
	t0 := time.Now()
	sb, err := r.c.Create(r.ctx, request(kind))
	d := time.Since(t0)
	if err != nil {
		return sb, 0, fmt.Errorf("create (kind %q): %w", kind, err)
	}
	if sb.FromPool != claim {
		_ = r.c.Delete(r.ctx, sb.ID)
		return sb, 0, fmt.Errorf("create %s: from_pool %v, want %v", sb.ID, sb.FromPool, claim)
	}
	return sb, d, nil
}

// warmUp makes and deletes one sandbox of each kind, untimed: the first
// of each fills caches (the template's root, the agent's binary) that
// every later one finds.
func (r *runner) warmUp() error {
	for _, kind := range []string{"", apitype.KindLXC} {
		sb, _, err := r.create(kind, false)
		if err != nil {
			return err
		}
		if err := r.c.Delete(r.ctx, sb.ID); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}

// cold times n cold creates of each kind, interleaved so the machine's
// load falls on both alike; the deletes are not timed.
func (r *runner) cold(n int, res *Result) error {
	for range n {
		if err := r.createBoth(false, res); err != nil {
			return err
		}
	}
	return nil
}

// createBoth times one create of a VM sandbox, then one of a container
// sandbox, each deleted (untimed) before the next: cold creates, or claims
// from the pool (claim), appended to res's Cold or Claims.
func (r *runner) createBoth(claim bool, res *Result) error {
	for _, k := range []struct {
		kind string
		into *Kind
	}{{"", &res.VM}, {apitype.KindLXC, &res.Container}} {
		sb, d, err := r.create(k.kind, claim)
		if err != nil {
			return err
		}
		if claim {
			k.into.Claims = append(k.into.Claims, d)
		} else {
			k.into.Cold = append(k.into.Cold, d)
		}
		if err := r.c.Delete(r.ctx, sb.ID); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
	}
	return nil
}

// idleAndExec keeps o.Idle sandboxes of each kind, lets them idle for
// o.Settle and reads each member's memory on the node, then times execs
// of argv true on the first of each kind (interleaved), through the API
// and at the guest call.
func (r *runner) idleAndExec(o Options, res *Result) (err error) {
	var vms, cts []apitype.Sandbox
	defer func() {
		for _, sb := range append(vms, cts...) {
			if derr := r.c.Delete(r.ctx, sb.ID); derr != nil && err == nil {
				err = fmt.Errorf("delete: %w", derr)
			}
		}
	}()
	for range o.Idle {
		for _, k := range []struct {
			kind string
			into *[]apitype.Sandbox
		}{{"", &vms}, {apitype.KindLXC, &cts}} {
			sb, _, err := r.create(k.kind, false)
			if err != nil {
				return err
			}
			*k.into = append(*k.into, sb)
		}
	}
	select {
	case <-r.ctx.Done():
		return r.ctx.Err()
	case <-time.After(o.Settle):
	}
	for _, sb := range vms {
		st := r.stats.VMStats(sb.VMs[0].VMID, 1)
		if slices.Contains(st.Missing, "cgroup") {
			return fmt.Errorf("VM %d: no cgroup on the node", sb.VMs[0].VMID)
		}
		res.VM.IdleMemory = append(res.VM.IdleMemory, st.MemoryBytes)
	}
	for _, sb := range cts {
		st := r.stats.CTStats(sb.VMs[0].VMID, 1)
		if slices.Contains(st.Missing, "cgroup") {
			return fmt.Errorf("container %d: no cgroup on the node", sb.VMs[0].VMID)
		}
		res.Container.IdleMemory = append(res.Container.IdleMemory, st.MemoryBytes)
	}
	return r.execs(o.Execs, vms[0], cts[0], res)
}

// execs times n execs of argv true on each of vm and ct.
func (r *runner) execs(n int, vm, ct apitype.Sandbox, res *Result) error {
	for range n {
		for _, k := range []struct {
			sb   apitype.Sandbox
			into *Kind
		}{{vm, &res.VM}, {ct, &res.Container}} {
			m := k.sb.VMs[0]
			t0 := time.Now()
			out, err := r.c.Exec(r.ctx, k.sb.ID, m.Name, apitype.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: 60})
			d := time.Since(t0)
			if err != nil || out.ExitCode != 0 {
				return fmt.Errorf("exec in %s (%d): %+v, %w", k.sb.ID, m.VMID, out, err)
			}
			k.into.ExecAPI = append(k.into.ExecAPI, d)
			g := r.eng.Guest(m.VMID)
			t0 = time.Now()
			gout, err := g.Exec(r.ctx, sandbox.GuestExec{Argv: []string{"true"}, Timeout: 60})
			d = time.Since(t0)
			if err != nil || gout.ExitCode != 0 {
				return fmt.Errorf("guest exec in %d: %+v, %w", m.VMID, gout, err)
			}
			k.into.ExecGuest = append(k.into.ExecGuest, d)
		}
	}
	return nil
}

// claims times n claims from each kind's pool (the VM shape's, then the
// container shape's), both shapes refilled (untimed) before each round.
func (r *runner) claims(n int, res *Result) error {
	for range n {
		r.eng.MaintainPool(r.ctx)
		if err := r.createBoth(true, res); err != nil {
			return err
		}
	}
	return nil
}
