package doctor

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// SandboxAPI is what the canary needs of the sandbox API
// (sandboxapi/client.Client has it).
type SandboxAPI interface {
	Create(ctx context.Context, r apitype.CreateRequest) (apitype.Sandbox, error)
	List(ctx context.Context) ([]apitype.Sandbox, error)
	Exec(ctx context.Context, id, vm string, r apitype.ExecRequest) (*apitype.ExecResult, error)
	WriteFile(ctx context.Context, id, vm, path string, r io.Reader, size int64, mode uint32) error
	ReadFile(ctx context.Context, id, vm, path string, w io.Writer) (int64, error)
	Snapshot(ctx context.Context, id, vm, name string) error
	Rollback(ctx context.Context, id, vm, name string) error
	Check(ctx context.Context, id, vm string) (apitype.CheckReport, error)
	Delete(ctx context.Context, id string) error
}

// CanaryOptions configure the canary.
type CanaryOptions struct {
	// Template is the template of the canary's VM.
	Template string
	// StreamBytes is the size of the streaming-path file (default 64 KiB).
	StreamBytes int64
	// DiskBytes is the size of the disk-path file: [api]
	// disk_transfer_threshold; 0 skips the disk path (it is off).
	DiskBytes int64
	// StepTimeout bounds each step (default 5 minutes).
	StepTimeout time.Duration
	// Containers is [api] containers: the daemon makes containers, so
	// ContainerCanary drives one.
	Containers bool
	// CTTemplate is the container canary's template ("": the first, by
	// name, of the container templates the token sees on the node).
	CTTemplate string
}

func (o *CanaryOptions) defaults() {
	if o.StreamBytes <= 0 {
		o.StreamBytes = 64 << 10
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = 5 * time.Minute
	}
}

// canary is one run's state.
type canary struct {
	api SandboxAPI
	px  API
	n   Node
	o   CanaryOptions
	// ct: the sandbox's one member is a container of template o.CTTemplate
	// (ContainerCanary), not a VM.
	ct bool
	// prefix starts every step's name ("canary: ", "canary (container): ").
	prefix string
	sb     *apitype.Sandbox
	rep    Report
}

// Step names, after the canary's prefix.
const (
	stepCreate = "create"
	stepDelete = "delete"
	stepLeft   = "nothing left behind"
)

// Canary creates a sandbox and drives it end to end through the sandbox
// API: exec, a file both ways on the streaming path and on the disk path,
// snapshot and rollback, the containment check, delete, and then checks
// on Proxmox that nothing is left (VMs, SDN zone, transfer images). Each step is timed; a
// step whose predecessor failed is skipped; the sandbox is deleted
// whatever failed.
func Canary(ctx context.Context, api SandboxAPI, px API, n Node, o CanaryOptions) Report {
	o.defaults()
	c := &canary{api: api, px: px, n: n, o: o, prefix: "canary: ", rep: Report{Pass: true}}
	c.step(ctx, stepCreate, c.create)
	c.step(ctx, "exec", c.exec)
	c.step(ctx, "file, streaming path", func(ctx context.Context) Outcome {
		return c.roundTrip(ctx, "/root/doctor-stream", o.StreamBytes, "streaming")
	})
	c.step(ctx, "file, disk path", func(ctx context.Context) Outcome {
		if o.DiskBytes <= 0 {
			return skipf("[api] disk_transfer_storage is off: no disk path")
		}
		return c.roundTrip(ctx, "/root/doctor-disk", o.DiskBytes, "disk")
	})
	c.step(ctx, "snapshot and rollback", c.snapshot)
	c.step(ctx, "containment check", c.check)
	c.end(ctx)
	return c.rep
}

// ContainerCanaryName is the one row of ContainerCanary when it does not
// run (containers off, no container template).
const ContainerCanaryName = "canary (container)"

// ContainerCanary is the canary of a sandbox whose one member is an
// unprivileged container (kind lxc) of o.CTTemplate, when o.Containers
// is on: create, exec, a file both ways (a container has no disk path),
// snapshot and rollback, the containment check from the container (its
// network rows and the rows only a container has: on a real node this is
// the proof of its walls, AppArmor's included), delete, and nothing left
// on Proxmox (the container, its zone), each a row of its own named
// "canary (container): ...". With containers off, or no container
// template known, it is one row saying so, which does not fail the run.
func ContainerCanary(ctx context.Context, api SandboxAPI, px API, n Node, o CanaryOptions) Report {
	o.defaults()
	if !o.Containers {
		return Run(ctx, []Check{{Name: ContainerCanaryName, Run: func(context.Context) Outcome {
			return skipf("[api] containers is off: sandboxes have no container members, nothing to try")
		}}})
	}
	rep := Report{Pass: true}
	if o.CTTemplate == "" {
		var name string
		rep = Run(ctx, []Check{{Name: ContainerCanaryName + ": template", Run: func(ctx context.Context) Outcome {
			var out Outcome
			name, out = firstCTTemplate(ctx, px, n)
			return out
		}}})
		if name == "" {
			return rep
		}
		o.CTTemplate = name
	}
	c := &canary{api: api, px: px, n: n, o: o, ct: true, prefix: ContainerCanaryName + ": ", rep: rep}
	c.step(ctx, stepCreate, c.create)
	c.step(ctx, "exec", c.exec)
	c.step(ctx, "file, streaming path", func(ctx context.Context) Outcome {
		return c.roundTrip(ctx, "/root/doctor-stream", o.StreamBytes, "streaming")
	})
	c.step(ctx, "snapshot and rollback", c.snapshot)
	c.step(ctx, "containment check", c.check)
	c.end(ctx)
	return c.rep
}

// firstCTTemplate returns the first, by name, of the container templates
// the token sees on node n (GET /nodes/{node}/lxc lists what it may
// audit; a container's name is its hostname), or "" and why not.
func firstCTTemplate(ctx context.Context, px API, n Node) (string, Outcome) {
	var cts []struct {
		VMID     int    `json:"vmid"`
		Name     string `json:"name"`
		Template int    `json:"template"`
	}
	if err := px.Get(ctx, "/nodes/"+url.PathEscape(n.Name)+"/lxc", &cts); err != nil {
		return "", failf("the token needs VM.Audit on the container templates (pve-access-setup --template VMID grants it)", "GET /nodes/%s/lxc: %v", n.Name, err)
	}
	var names []string
	ids := map[string]int{}
	for _, ct := range cts {
		if ct.Template == 1 && ct.Name != "" {
			names = append(names, ct.Name)
			ids[ct.Name] = ct.VMID
		}
	}
	if len(names) == 0 {
		return "", warnf("make a container template (pct template VMID) and grant it as pve-access-setup grants a template (--template VMID), or give doctor --ct-template NAME",
			"[api] containers is on, but the token sees no container template on node %s: no container canary, and every kind lxc member will be refused", n.Name)
	}
	slices.Sort(names)
	return names[0], passf("container template %s (%d), the first of %d by name (--ct-template picks another)", names[0], ids[names[0]], len(names))
}

// end deletes the sandbox and looks for what it left, whatever failed
// before.
func (c *canary) end(ctx context.Context) {
	deleted := false
	c.always(ctx, stepDelete, func(ctx context.Context) Outcome {
		if c.sb == nil {
			return skipf("nothing was created")
		}
		if err := c.api.Delete(ctx, c.sb.ID); err != nil {
			return failf("delete it by hand (pve-inspectd sandbox delete "+c.sb.ID+") and read the daemon's log", "delete %s: %v", c.sb.ID, err)
		}
		deleted = true
		return passf("sandbox %s deleted", c.sb.ID)
	})
	c.always(ctx, stepLeft, func(ctx context.Context) Outcome {
		if c.sb == nil || !deleted {
			return skipf("no deleted sandbox to look for")
		}
		return c.leftovers(ctx)
	})
}

// step runs f unless an earlier step failed or was skipped for want of a
// sandbox.
func (c *canary) step(ctx context.Context, name string, f func(context.Context) Outcome) {
	if c.sb == nil && name != stepCreate {
		c.rep.add(c.prefix+name, skipf("no sandbox (create failed)"), 0)
		return
	}
	c.always(ctx, name, f)
}

// always runs f with the step timeout.
func (c *canary) always(ctx context.Context, name string, f func(context.Context) Outcome) {
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	defer cancel()
	if name == stepDelete || name == stepLeft {
		// The clean-up runs even when the caller's context ended.
		sctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.o.StepTimeout)
		defer cancel()
	}
	o, d := timed(func() Outcome { return f(sctx) })
	c.rep.add(c.prefix+name, o, d)
}

const daemonLog = "read the daemon's log (journalctl -u pve-inspectd) for the Proxmox call that failed; the read-only checks above name most causes"

// ctFix is what to look at when the daemon cannot make or enter a
// container.
const ctFix = "the daemon enters containers itself: check [api] lxc_path and container_cgroups, and the unit's drop-in (ProtectControlGroups=no, RestrictNamespaces=no; README, Containers); "

func (c *canary) create(ctx context.Context) Outcome {
	req := apitype.VMRequest{Template: c.o.Template}
	what, fix := "VM", daemonLog
	if c.ct {
		req = apitype.VMRequest{Kind: apitype.KindLXC, Template: c.o.CTTemplate}
		what, fix = "container", "the template must be an unprivileged container without features, devices or mount points (the error names what is not); "+ctFix+daemonLog
	}
	sb, err := c.api.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{req},
		Labels: map[string]string{"pve-inspect-doctor": "canary"}, TTLSeconds: 1800})
	if err != nil {
		return failf(fix, "create from template %q: %v", req.Template, err)
	}
	c.sb = &sb
	if len(sb.VMs) != 1 {
		return failf("report this", "sandbox %s has %d VMs, want 1", sb.ID, len(sb.VMs))
	}
	if c.ct && sb.VMs[0].Kind != apitype.KindLXC {
		return failf("report this", "sandbox %s: member %d is of kind %q, want a container (lxc)", sb.ID, sb.VMs[0].VMID, sb.VMs[0].Kind)
	}
	return passf("sandbox %s: %s %d, zone %s", sb.ID, what, sb.VMs[0].VMID, sb.Zone)
}

func (c *canary) vm() string { return c.sb.VMs[0].Name }

func (c *canary) exec(ctx context.Context) Outcome {
	res, err := c.api.Exec(ctx, c.sb.ID, c.vm(), apitype.ExecRequest{Argv: []string{"uname", "-s"}})
	if err != nil {
		fix := "check the template's guest agent (qemu-guest-agent running, agent enabled=1) and [api] qga_dir"
		if c.ct {
			fix = ctFix + daemonLog
		}
		return failf(fix, "exec: %v", err)
	}
	if res.ExitCode != 0 || string(res.Stdout) != "Linux\n" {
		return failf("check the template's image: uname -s must print Linux", "uname -s: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	return passf("uname -s: Linux")
}

func (c *canary) roundTrip(ctx context.Context, path string, size int64, how string) Outcome {
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return failf("report this", "random data: %v", err)
	}
	fix := daemonLog
	if how == "disk" {
		fix = "see the storage, template (hotplug) and unit checks; " + daemonLog
	}
	t0 := time.Now()
	if err := c.api.WriteFile(ctx, c.sb.ID, c.vm(), path, bytes.NewReader(data), size, 0o600); err != nil {
		return failf(fix, "write %d bytes to %s: %v", size, path, err)
	}
	up := time.Since(t0)
	var back bytes.Buffer
	t0 = time.Now()
	if _, err := c.api.ReadFile(ctx, c.sb.ID, c.vm(), path, &back); err != nil {
		return failf(fix, "read %s back: %v", path, err)
	}
	down := time.Since(t0)
	if sha256.Sum256(back.Bytes()) != sha256.Sum256(data) {
		return failf("report this: the file came back different", "%s: read %d bytes, content differs from the %d written", path, back.Len(), size)
	}
	return passf("%d bytes in %v, out %v, sha256 equal", size, up.Round(time.Millisecond), down.Round(time.Millisecond))
}

func (c *canary) snapshot(ctx context.Context) Outcome {
	const path, name = "/root/doctor-snap", "doctor"
	if err := c.api.WriteFile(ctx, c.sb.ID, c.vm(), path, strings.NewReader("before\n"), -1, 0); err != nil {
		return failf(daemonLog, "write %s: %v", path, err)
	}
	if err := c.api.Snapshot(ctx, c.sb.ID, c.vm(), name); err != nil {
		storage := "the template's storage must support snapshots (lvmthin, zfs, qcow2 on dir)"
		if c.ct {
			storage = "the container template's rootfs storage must support snapshots (lvmthin, zfs, ceph; not a dir storage)"
		}
		return failf("the token needs VM.Snapshot on the pool, and "+storage+"; "+daemonLog, "snapshot: %v", err)
	}
	if err := c.api.WriteFile(ctx, c.sb.ID, c.vm(), path, strings.NewReader("after\n"), -1, 0); err != nil {
		return failf(daemonLog, "write %s after the snapshot: %v", path, err)
	}
	if err := c.api.Rollback(ctx, c.sb.ID, c.vm(), name); err != nil {
		return failf("the token needs VM.Snapshot.Rollback and VM.PowerMgmt on the pool; "+daemonLog, "rollback: %v", err)
	}
	res, err := c.api.Exec(ctx, c.sb.ID, c.vm(), apitype.ExecRequest{Argv: []string{"cat", path}})
	if err != nil {
		return failf(daemonLog, "read %s after the rollback: %v", path, err)
	}
	if string(res.Stdout) != "before\n" {
		return failf("report this: the rollback did not restore the disk", "%s after the rollback: %q, want \"before\\n\"", path, res.Stdout)
	}
	return passf("rolled back: the file written after the snapshot is undone")
}

func (c *canary) check(ctx context.Context) Outcome {
	rep, err := c.api.Check(ctx, c.sb.ID, "")
	if err != nil {
		return failf("check [check] probe_path and the guest's /tmp; "+daemonLog, "containment check: %v", err)
	}
	if !rep.Pass {
		var rows []string
		for _, r := range rep.Rows {
			if !r.Pass {
				rows = append(rows, fmt.Sprintf("%s %s: want %s, saw %s", r.Target, r.Probe, r.Expected, r.Observed))
			}
		}
		return failf("pve-inspectd status shows what the guard lacks; pve-inspectd check "+c.sb.ID+" prints the table", "containment check FAILED: %s", strings.Join(rows, "; "))
	}
	return passf("%d probes pass", len(rep.Rows))
}

// leftovers looks for the sandbox in the API, and on Proxmox for its VMs
// (its container), its zone and images of its VMs on the transfer
// storage (a transfer whose clean-up failed leaks one).
func (c *canary) leftovers(ctx context.Context) Outcome {
	var left []string
	l, err := c.api.List(ctx)
	if err != nil {
		return failf(daemonLog, "list sandboxes: %v", err)
	}
	for _, s := range l {
		if s.ID == c.sb.ID {
			left = append(left, "sandbox "+s.ID+" still listed ("+s.State+")")
		}
	}
	var vms []struct {
		VMID int `json:"vmid"`
	}
	kind, what := "qemu", "VM"
	if c.ct {
		kind, what = "lxc", "container"
	}
	if err := c.px.Get(ctx, "/nodes/"+url.PathEscape(c.n.Name)+"/"+kind, &vms); err != nil {
		return failf("the token needs VM.Audit on the pool", "GET /nodes/%s/%s: %v", c.n.Name, kind, err)
	}
	for _, v := range c.sb.VMs {
		if slices.ContainsFunc(vms, func(x struct {
			VMID int `json:"vmid"`
		}) bool {
			return x.VMID == v.VMID
		}) {
			left = append(left, fmt.Sprintf("%s %d", what, v.VMID))
		}
	}
	var zones []struct {
		Zone string `json:"zone"`
	}
	if err := c.px.Get(ctx, "/cluster/sdn/zones?pending=1", &zones); err != nil {
		return failf("the token needs SDN.Audit on /sdn", "GET /cluster/sdn/zones: %v", err)
	}
	for _, z := range zones {
		if c.sb.Zone != "" && z.Zone == c.sb.Zone {
			left = append(left, "SDN zone "+z.Zone)
		}
	}
	if st := c.n.TransferStorage; st != "" && !c.ct {
		for _, v := range c.sb.VMs {
			var vols []struct {
				VolID string `json:"volid"`
			}
			if err := c.px.Get(ctx, fmt.Sprintf("/nodes/%s/storage/%s/content?vmid=%d", url.PathEscape(c.n.Name), url.PathEscape(st), v.VMID), &vols); err != nil {
				return failf("the token needs Datastore.Allocate on the transfer storage (pve-access-setup grants it)", "list %s: %v", st, err)
			}
			for _, vol := range vols {
				left = append(left, "volume "+vol.VolID)
			}
		}
	}
	if len(left) > 0 {
		return failf("remove them by hand (qm destroy or pct destroy, pvesh delete /cluster/sdn/zones/...) and "+daemonLog, "left behind: %s", strings.Join(left, ", "))
	}
	if c.ct {
		return passf("no sandbox, container or zone of %s left", c.sb.ID)
	}
	return passf("no sandbox, VM, zone or transfer image of %s left", c.sb.ID)
}

// errNoDaemon is the sandbox API check's failure.
var errNoDaemon = errors.New("the sandbox API does not answer")

// DaemonCheck wants the daemon's sandbox API to answer (the canary's
// first need).
func DaemonCheck(health func(ctx context.Context) error) Check {
	return Check{Name: "sandbox api", Run: func(ctx context.Context) Outcome {
		if err := health(ctx); err != nil {
			return failf("start the daemon (systemctl start pve-inspectd) with [api] enabled = true; check [api] socket", "%v: %v", errNoDaemon, err)
		}
		return passf("the daemon answers")
	}}
}
