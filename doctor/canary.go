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
}

// canary is one run's state.
type canary struct {
	api SandboxAPI
	px  API
	n   Node
	o   CanaryOptions
	sb  *apitype.Sandbox
	rep Report
}

// Canary creates a sandbox and drives it end to end through the sandbox
// API: exec, a file both ways on the streaming path and on the disk path,
// snapshot and rollback, the containment check, delete, and then checks
// on Proxmox that nothing is left (VMs, SDN zone, transfer images). Each step is timed; a
// step whose predecessor failed is skipped; the sandbox is deleted
// whatever failed.
func Canary(ctx context.Context, api SandboxAPI, px API, n Node, o CanaryOptions) Report {
	if o.StreamBytes <= 0 {
		o.StreamBytes = 64 << 10
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = 5 * time.Minute
	}
	c := &canary{api: api, px: px, n: n, o: o, rep: Report{Pass: true}}
	c.step(ctx, "canary: create", c.create)
	c.step(ctx, "canary: exec", c.exec)
	c.step(ctx, "canary: file, streaming path", func(ctx context.Context) Outcome {
		return c.roundTrip(ctx, "/root/doctor-stream", o.StreamBytes, "streaming")
	})
	c.step(ctx, "canary: file, disk path", func(ctx context.Context) Outcome {
		if o.DiskBytes <= 0 {
			return skipf("[api] disk_transfer_storage is off: no disk path")
		}
		return c.roundTrip(ctx, "/root/doctor-disk", o.DiskBytes, "disk")
	})
	c.step(ctx, "canary: snapshot and rollback", c.snapshot)
	c.step(ctx, "canary: containment check", c.check)
	deleted := false
	c.always(ctx, "canary: delete", func(ctx context.Context) Outcome {
		if c.sb == nil {
			return skipf("nothing was created")
		}
		if err := c.api.Delete(ctx, c.sb.ID); err != nil {
			return failf("delete it by hand (pve-inspectd sandbox delete "+c.sb.ID+") and read the daemon's log", "delete %s: %v", c.sb.ID, err)
		}
		deleted = true
		return passf("sandbox %s deleted", c.sb.ID)
	})
	c.always(ctx, "canary: nothing left behind", func(ctx context.Context) Outcome {
		if c.sb == nil || !deleted {
			return skipf("no deleted sandbox to look for")
		}
		return c.leftovers(ctx)
	})
	return c.rep
}

// step runs f unless an earlier step failed or was skipped for want of a
// sandbox.
func (c *canary) step(ctx context.Context, name string, f func(context.Context) Outcome) {
	if c.sb == nil && name != "canary: create" {
		c.rep.add(name, skipf("no sandbox (create failed)"), 0)
		return
	}
	c.always(ctx, name, f)
}

// always runs f with the step timeout.
func (c *canary) always(ctx context.Context, name string, f func(context.Context) Outcome) {
	sctx, cancel := context.WithTimeout(ctx, c.o.StepTimeout)
	defer cancel()
	if name == "canary: delete" || name == "canary: nothing left behind" {
		// The clean-up runs even when the caller's context ended.
		sctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), c.o.StepTimeout)
		defer cancel()
	}
	o, d := timed(func() Outcome { return f(sctx) })
	c.rep.add(name, o, d)
}

const daemonLog = "read the daemon's log (journalctl -u pve-inspectd) for the Proxmox call that failed; the read-only checks above name most causes"

func (c *canary) create(ctx context.Context) Outcome {
	sb, err := c.api.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: c.o.Template}},
		Labels: map[string]string{"pve-inspect-doctor": "canary"}, TTLSeconds: 1800})
	if err != nil {
		return failf(daemonLog, "create from template %q: %v", c.o.Template, err)
	}
	if len(sb.VMs) != 1 {
		c.sb = &sb
		return failf("report this", "sandbox %s has %d VMs, want 1", sb.ID, len(sb.VMs))
	}
	c.sb = &sb
	return passf("sandbox %s: VM %d, zone %s", sb.ID, sb.VMs[0].VMID, sb.Zone)
}

func (c *canary) vm() string { return c.sb.VMs[0].Name }

func (c *canary) exec(ctx context.Context) Outcome {
	res, err := c.api.Exec(ctx, c.sb.ID, c.vm(), apitype.ExecRequest{Argv: []string{"uname", "-s"}})
	if err != nil {
		return failf("check the template's guest agent (qemu-guest-agent running, agent enabled=1) and [api] qga_dir", "exec: %v", err)
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
		return failf("the token needs VM.Snapshot on the pool, and the template's storage must support snapshots (lvmthin, zfs, qcow2 on dir); "+daemonLog, "snapshot: %v", err)
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

// leftovers looks for the sandbox in the API, and on Proxmox for its VMs,
// its zone and images of its VMs on the transfer storage (a transfer
// whose clean-up failed leaks one).
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
	if err := c.px.Get(ctx, "/nodes/"+url.PathEscape(c.n.Name)+"/qemu", &vms); err != nil {
		return failf("the token needs VM.Audit on the pool", "GET /nodes/%s/qemu: %v", c.n.Name, err)
	}
	for _, v := range c.sb.VMs {
		if slices.ContainsFunc(vms, func(x struct {
			VMID int `json:"vmid"`
		}) bool {
			return x.VMID == v.VMID
		}) {
			left = append(left, fmt.Sprintf("VM %d", v.VMID))
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
	if st := c.n.TransferStorage; st != "" {
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
		return failf("remove them by hand (qm destroy, pvesh delete /cluster/sdn/zones/...) and "+daemonLog, "left behind: %s", strings.Join(left, ", "))
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
