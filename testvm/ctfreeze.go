package testvm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ctFreezeBound bounds a container's freeze or thaw; pve-container gives
// lxc's freeze and unfreeze commands 30 (LXC.pm freeze, thaw).
const ctFreezeBound = 30 * time.Second

// ctFreezeAttempt bounds one lxc-freeze (FreezeContainer).
const ctFreezeAttempt = 4 * time.Second

// FreezeContainer freezes every process of a running container and
// returns once all are frozen, as pve-container's LXC::freeze does for a
// snapshot: lxc-freeze sets the container's freezer cgroup to FROZEN and
// waits for it on a legacy or hybrid host, and on a cgroup v2 one has
// the container's monitor write its cgroup.freeze and wait for "frozen
// 1" in cgroup.events. On a freezer v1 host a freeze racing the
// container's forks can stay FREEZING with every task in the
// refrigerator (seen on the bed with a loop forking in the container),
// so an attempt that has not ended in ctFreezeAttempt is thawed and
// tried again, for at most ctFreezeBound in all. A freeze that failed
// may leave the container partly frozen, which ThawContainer undoes.
func (b *Bed) FreezeContainer(ctx context.Context, vmid int) error {
	ctx, cancel := context.WithTimeout(ctx, ctFreezeBound)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, ctFreezeAttempt)
		err := b.freezeTool(actx, vmid, "lxc-freeze")
		acancel()
		if err == nil || ctx.Err() != nil || !errors.Is(actx.Err(), context.DeadlineExceeded) {
			return err
		}
		if err := b.freezeTool(ctx, vmid, "lxc-unfreeze"); err != nil {
			return err
		}
	}
}

// ThawContainer thaws a container (lxc-unfreeze), bounded as
// FreezeContainer; one that is not frozen is no error.
func (b *Bed) ThawContainer(ctx context.Context, vmid int) error {
	return b.freezeTool(ctx, vmid, "lxc-unfreeze")
}

// freezeTool runs lxc-freeze or lxc-unfreeze on a running container for
// at most ctFreezeBound.
func (b *Bed) freezeTool(ctx context.Context, vmid int, tool string) error {
	if c, ok := b.Container(vmid); !ok || !c.Alive() {
		return fmt.Errorf("testvm: container %d is not running", vmid)
	}
	ctx, cancel := context.WithTimeout(ctx, ctFreezeBound)
	defer cancel()
	if _, err := b.lxcTool(ctx, tool, vmid); err != nil {
		return fmt.Errorf("testvm: container %d: %w", vmid, err)
	}
	return nil
}

// thawCgroups thaws container vmid's cgroups without its monitor:
// freezer.state THAWED in the freezer v1 hierarchy, cgroup.freeze 0 in
// the unified one (what exists of them). A frozen process cannot die,
// and lxc-stop thaws the container only through a monitor that answers,
// so a stop that has to kill the container thaws it first.
func (b *Bed) thawCgroups(vmid int) {
	for _, d := range b.ctCgroupDirs(vmid) {
		thawTree(d)
	}
}
