package sandbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// A sandbox's members are of two kinds (apitype.VMRequest.Kind): QEMU VMs
// and unprivileged containers (pve-container). Both live in Proxmox's one
// VMID space, in the daemon's pool, tagged alike, on the sandbox's vnets
// behind the same guard; what differs is the API they are made and
// removed through (/nodes/{node}/qemu or /lxc) and how the daemon reaches
// their inside (the VM's guest agent, or entering the container from the
// node: Options.CTGuests). memberOps is the part of each API the life
// cycle needs, under one set of names, so that delete, reconcile and the
// health checks treat both alike.

// memberOps is the Proxmox calls a sandbox member's life cycle needs.
type memberOps interface {
	// VM returns the member's status, tags and pool (ErrNotFound when
	// there is no member of this kind with that id).
	VM(ctx context.Context, vmid int) (VMInfo, error)
	StartVM(ctx context.Context, vmid int) error
	StopVM(ctx context.Context, vmid int) error
	DeleteVM(ctx context.Context, vmid int) error
}

// ctOps is a Containers under memberOps' names.
type ctOps struct{ c Containers }

func (o ctOps) VM(ctx context.Context, vmid int) (VMInfo, error) {
	info, err := o.c.CT(ctx, vmid)
	info.Kind = apitype.KindLXC
	return info, err
}
func (o ctOps) StartVM(ctx context.Context, vmid int) error  { return o.c.StartCT(ctx, vmid) }
func (o ctOps) StopVM(ctx context.Context, vmid int) error   { return o.c.StopCT(ctx, vmid) }
func (o ctOps) DeleteVM(ctx context.Context, vmid int) error { return o.c.DeleteCT(ctx, vmid) }

// errNoContainers refuses a container where the engine has none
// configured.
func errNoContainers() error {
	return refuse(ErrNotConfigured, "containers (kind lxc) are not enabled on this node ([api] containers)")
}

// makesContainers reports whether the engine makes containers: it has
// their Proxmox API and a way into them.
func (m *Engine) makesContainers() bool { return m.o.Containers != nil && m.o.CTGuests != nil }

// opsOf returns the calls of a member of kind.
func (m *Engine) opsOf(kind string) (memberOps, error) {
	if kind != apitype.KindLXC {
		return m.vms, nil
	}
	if m.o.Containers == nil {
		return nil, errNoContainers()
	}
	return ctOps{m.o.Containers}, nil
}

// busyLock is the config lock Proxmox keeps on a member of kind while
// the clone that makes it still runs: qemu-server's clone_vm "clone",
// pve-container's clone_vm "create" (create_and_lock_config).
func busyLock(kind string) string {
	if kind == apitype.KindLXC {
		return "create"
	}
	return "clone"
}

// kindOf returns the kind of the member whose id is vmid in this
// engine's records: a sandbox's or a pool member's, one not being
// deleted first (its id may have been freed and taken by the next
// member already).
func (m *Engine) kindOf(vmid int) string { return m.vmOf(vmid).Kind }

// vmOf returns the record of member vmid as kindOf finds it (the zero VM
// when there is none).
func (m *Engine) vmOf(vmid int) apitype.VM {
	m.mu.Lock()
	defer m.mu.Unlock()
	var vm apitype.VM
	found := false
	for _, recs := range []map[string]*record{m.sbx, m.members} {
		for _, r := range recs {
			for _, v := range r.VMs {
				if v.VMID != vmid {
					continue
				}
				if r.State != apitype.StateDeleting {
					return v
				}
				if !found {
					vm, found = v, true
				}
			}
		}
	}
	return vm
}

// templateIDOf resolves a template name of kind.
func (m *Engine) templateIDOf(ctx context.Context, kind, name string) (int, error) {
	if kind != apitype.KindLXC {
		return m.templateID(ctx, name)
	}
	if !m.makesContainers() {
		return 0, errNoContainers()
	}
	id, err := m.o.Containers.CTTemplateID(ctx, name)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return 0, invalid("template", "unknown container template %q", name)
		}
		return 0, pxErr("look up container template "+name, err)
	}
	return id, nil
}

// reCTMount matches a container's mount point and device keys.
var reCTMount = regexp.MustCompile(`^(mp|dev)\d+$`)

// ctUnsafe lists what in a container's config breaks the daemon's rule
// for containers: unprivileged (root inside is an unprivileged uid on the
// node), no feature flags (nesting, keyctl, fuse, mknod: each opens a
// kernel interface the container does not need), no device passthrough
// (devN) and no mount point (mpN, which may bind a node path), no raw lxc
// keys (pve-container's config read answers them as one key "lxc", the
// list of [key, value] pairs: API2/LXC/Config.pm vm_config, LXC/Config.pm
// parse_pct_config; clone_vm copies them and update_lxc_config writes
// them into the container's lxc config as they are: an idmap, a mount
// entry, an AppArmor profile, a hook run on the node), no hookscript (run
// on the node at each start and stop) and no protection (which refuses
// the container's destroy: it would outlive its sandbox). Proxmox does
// not refuse nesting=1 to a token with VM.Allocate (pve-container LXC.pm
// check_ct_modify_config_perm), so this is the daemon's own check, on the
// template and again on each clone.
func ctUnsafe(conf map[string]string) []string {
	var bad []string
	if conf["unprivileged"] != "1" {
		bad = append(bad, "privileged (unprivileged is not 1)")
	}
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch {
		case k == "features" && conf[k] != "":
			bad = append(bad, "feature flags "+conf[k])
		case k == "lxc" && conf[k] != "" && conf[k] != "[]":
			bad = append(bad, "raw lxc keys "+conf[k])
		case k == "hookscript" && conf[k] != "":
			bad = append(bad, "hookscript "+conf[k])
		case k == "protection" && conf[k] != "" && conf[k] != "0":
			bad = append(bad, "protection (its destroy would be refused)")
		case reCTMount.MatchString(k):
			bad = append(bad, k+" (a device or mount point)")
		case strings.HasPrefix(k, "lxc."):
			bad = append(bad, k+" (a raw lxc key)")
		}
	}
	return bad
}

// checkCT refuses a container (a template or a fresh clone) whose config
// breaks the rule of ctUnsafe.
func (m *Engine) checkCT(ctx context.Context, what string, vmid int) error {
	conf, err := m.o.Containers.CTConfigValues(ctx, vmid)
	if err != nil {
		return pxErr(fmt.Sprintf("read config of %s %d", what, vmid), err)
	}
	if bad := ctUnsafe(conf); len(bad) > 0 {
		return &NotHardenedError{Items: bad, Msg: fmt.Sprintf("%s %d is not an unprivileged container without features, devices or mount points: %s",
			what, vmid, strings.Join(bad, "; "))}
	}
	return nil
}

// buildCT configures, checks and starts container vmid (cloned already)
// of rec's member spec on bridges, waits until the daemon can enter it
// and writes the secrets file: buildVM's part after the clone.
func (m *Engine) buildCT(ctx context.Context, rec *record, spec apitype.VM, vmid int, bridges []string, env map[string]string) error {
	cfg := CTConfig{Tags: m.vmTags(rec), Hostname: m.vmName(rec.ID, spec.Name), Cores: spec.Cores, MemoryMiB: spec.MemoryMiB, Bridges: bridges}
	if err := m.o.Containers.ConfigureCT(ctx, vmid, cfg); err != nil {
		return pxErr(fmt.Sprintf("configure container %d", vmid), err)
	}
	if err := m.checkCT(ctx, "container", vmid); err != nil {
		return err
	}
	if err := m.startVM(ctx, ctOps{m.o.Containers}, vmid, false); err != nil {
		return pxErr(fmt.Sprintf("start container %d", vmid), err)
	}
	if err := m.waitAgent(ctx, vmid); err != nil {
		return err
	}
	return m.writeEnv(ctx, vmid, env)
}

// retag gives member v (of either kind) the Proxmox name and tags of the
// sandbox that claimed it: one synchronous config update of each kind's
// API that changes nothing else (a running member's NICs stay).
func (m *Engine) retag(ctx context.Context, v apitype.VM, name string, tags []string) error {
	if v.Kind != apitype.KindLXC {
		if err := m.tagger.SetVMTags(ctx, v.VMID, name, tags); err != nil {
			return pxErr(fmt.Sprintf("tag vm %d", v.VMID), err)
		}
		return nil
	}
	if m.o.Containers == nil {
		return errNoContainers()
	}
	if err := m.o.Containers.SetCTTags(ctx, v.VMID, name, tags); err != nil {
		return pxErr(fmt.Sprintf("tag container %d", v.VMID), err)
	}
	return nil
}

// ctStatus reads container vmid's run state (no QMP status).
func (m *Engine) ctStatus(ctx context.Context, vmid int) (VMRunState, error) {
	if m.o.Containers == nil {
		return VMRunState{}, errNoContainers()
	}
	info, err := m.o.Containers.CT(ctx, vmid)
	if err != nil {
		return VMRunState{}, err
	}
	return VMRunState{Status: info.Status}, nil
}

// ctCloneLocked is pve-container's refusal of a clone whose source holds
// a config lock (clone_vm set_lock: "CT is locked (disk)" while another
// clone of it runs): the request made nothing.
var ctCloneLocked = regexp.MustCompile(`CT is locked \(disk\)`)

// ctCloneTries and ctCloneWait bound cloneCT's retries of a template
// another daemon (another node's, or one sharing the cluster) is cloning.
const (
	ctCloneTries = 30
	ctCloneWait  = 500 * time.Millisecond
)

// cloneCT clones a container template. pve-container's clone_vm locks
// the source ("lock: disk") from the request until the clone's task
// ends, and refuses a second clone meanwhile, where qemu-server's clone
// of a VM template takes a shared lock: so this engine clones one
// template one clone at a time (two containers of one template in a
// sandbox, or two tenants' creates), and a clone refused because another
// client holds the template is tried again, a little later, within ctx.
func (m *Engine) cloneCT(ctx context.Context, s CloneSpec) error {
	if m.o.Containers == nil {
		return errNoContainers()
	}
	mu, _ := m.ctClones.LoadOrStore(s.Template, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	for try := 1; ; try++ {
		err := m.o.Containers.CloneCT(ctx, s)
		if err == nil || !ctCloneLocked.MatchString(err.Error()) || try == ctCloneTries {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (waiting for the template's other clone: %w)", err, ctx.Err())
		case <-time.After(ctCloneWait):
		}
	}
}
