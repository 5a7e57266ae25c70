package sandbox

import (
	"context"
	"fmt"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Check runs the containment check from member vm of sandbox sb (an
// operation begun with Begin), a VM or a container (whose Guest enters
// it from the node; the check adds the rows of a shared kernel), with the
// node's other ready sandboxes as the cross-zone targets.
// ErrNotConfigured when no Checker is set.
func (m *Engine) Check(ctx context.Context, sb apitype.Sandbox, vm apitype.VM) (apitype.CheckReport, error) {
	if m.o.Checker == nil {
		return apitype.CheckReport{}, refuse(ErrNotConfigured, "the containment check is not configured")
	}
	if vm.NoNetwork {
		return apitype.CheckReport{}, errNoNetwork(vm)
	}
	if len(vm.Networks) == 0 {
		return apitype.CheckReport{}, refuse(ErrConflict, "sandbox %s vm %s has no network: the containment check runs from a member whose first NIC is on a network of its sandbox", sb.ID, vm.Name)
	}
	if err := errSharedFirst(vm); err != nil {
		return apitype.CheckReport{}, fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	var others []apitype.Sandbox
	for _, o := range m.List() {
		if o.ID != sb.ID && o.State == apitype.StateReady {
			others = append(others, o)
		}
	}
	t := CheckTarget{Sandbox: sb, VM: vm, Guest: m.Guest(vm.VMID), Others: others}
	if m.o.Egress != nil {
		t.ReapplyEgress = func(ctx context.Context) error { return m.reapplyEgress(ctx, sb) }
	}
	// a guest call of the sandbox's owner, charged to its share
	rep, err := m.o.Checker.Run(WithOwner(ctx, sb.Owner), t)
	if err != nil {
		return apitype.CheckReport{}, fmt.Errorf("sandbox %s vm %s: %w", sb.ID, vm.Name, err)
	}
	rep.Sandbox, rep.VM = sb.ID, vm.Name
	rep.Health = m.healthOf(sb.ID)
	return rep, nil
}

// CheckTarget is what the containment check needs to know about a sandbox.
type CheckTarget struct {
	Sandbox apitype.Sandbox
	// VM is the member the probe runs in (Kind says VM or container).
	VM apitype.VM
	// Guest is its inside (Engine.Guest): a VM's agent, or the container
	// entered from the node.
	Guest Guest
	// Others are the other ready sandboxes of this node (cross-zone
	// probes). The check makes no call into their guests: their addresses
	// come from the node (containment.SandboxChecker.GuestAddrs).
	Others []apitype.Sandbox
	// ReapplyEgress, when set, puts the sandbox's egress policy in force
	// again, unchanged: a new policy generation, which cuts every
	// connection the egress proxy holds for the zone (the check's row of
	// an old keep-alive connection). Nil when egress policies are off.
	ReapplyEgress func(ctx context.Context) error
}

// reapplyEgress sets sb's egress policy in force again, as it is.
func (m *Engine) reapplyEgress(ctx context.Context, sb apitype.Sandbox) error {
	p := m.o.Egress.Status(sb.ID, sb.Zone).Policy
	if err := m.o.Egress.Set(ctx, sb.ID, sb.Zone, sandboxBridges(sb), p); err != nil {
		return fmt.Errorf("re-apply the egress policy of %s: %w", sb.ID, err)
	}
	return nil
}

// Checker runs the containment check (DESIGN.md section 7) from inside a
// member, VM or container. Implemented by containment.SandboxChecker.
type Checker interface {
	Run(ctx context.Context, t CheckTarget) (apitype.CheckReport, error)
}
