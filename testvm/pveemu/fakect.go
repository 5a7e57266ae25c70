package pveemu

import (
	"context"
	"fmt"
	"time"
)

// FakeBackend's containers (ContainerBackend, CTFreezer): recorded, never
// run.

// fakeCTPID is the pid a fake container's init has.
func fakeCTPID(vmid int) int { return 1<<22 + vmid }

// StartContainer implements ContainerBackend: the container is only
// recorded; its init's pid is a made-up one.
func (f *FakeBackend) StartContainer(_ context.Context, c CTSpec) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.cts[c.VMID]; ok {
		return 0, fmt.Errorf("container %d already running", c.VMID)
	}
	if c.Net != nil && !f.hasBridgeLocked(c.Net.Bridge) {
		return 0, fmt.Errorf("bridge %s does not exist", c.Net.Bridge)
	}
	if f.cts == nil {
		f.cts = map[int]CTSpec{}
	}
	f.cts[c.VMID] = c
	mac := ""
	if c.Net != nil {
		mac = c.Net.MAC.String()
	}
	f.note("start-ct %d mac=%s", c.VMID, mac)
	return fakeCTPID(c.VMID), nil
}

// StopContainer implements ContainerBackend.
func (f *FakeBackend) StopContainer(_ context.Context, vmid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cts, vmid)
	f.note("stop-ct %d", vmid)
	return nil
}

// ShutdownContainer implements ContainerBackend: a fake container always
// powers off in time.
func (f *FakeBackend) ShutdownContainer(_ context.Context, vmid int, timeout time.Duration, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cts, vmid)
	f.note("shutdown-ct %d timeout=%s force=%v", vmid, timeout, force)
	return nil
}

// ContainerPID implements ContainerBackend.
func (f *FakeBackend) ContainerPID(vmid int) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.cts[vmid]; !ok {
		return 0, false
	}
	return fakeCTPID(vmid), true
}

// Container returns the spec a running fake container was started with.
func (f *FakeBackend) Container(vmid int) (CTSpec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.cts[vmid]
	return c, ok
}

// PowerOffContainer ends a fake container as if its init had powered off
// by itself.
func (f *FakeBackend) PowerOffContainer(vmid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cts, vmid)
}

// FreezeContainer implements CTFreezer: a running container is only
// marked frozen; FailFreeze makes it fail.
func (f *FakeBackend) FreezeContainer(_ context.Context, vmid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("freeze-ct %d", vmid)
	if _, ok := f.cts[vmid]; !ok {
		return fmt.Errorf("fake: container %d is not running", vmid)
	}
	if err := f.freezeFail[vmid]; err != nil {
		return err
	}
	if f.frozen == nil {
		f.frozen = map[int]bool{}
	}
	f.frozen[vmid] = true
	return nil
}

// ThawContainer implements CTFreezer.
func (f *FakeBackend) ThawContainer(_ context.Context, vmid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("thaw-ct %d", vmid)
	delete(f.frozen, vmid)
	return nil
}

// Frozen reports whether a container is frozen.
func (f *FakeBackend) Frozen(vmid int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen[vmid]
}

// FailFreeze makes container vmid's freezes fail with err (nil: succeed
// again).
func (f *FakeBackend) FailFreeze(vmid int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.freezeFail == nil {
		f.freezeFail = map[int]error{}
	}
	f.freezeFail[vmid] = err
}
