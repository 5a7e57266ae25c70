package pveapi

import (
	"context"
	"errors"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestVMStatus: the health monitor's read of status/current gives the
// Proxmox status and the QMP status, and a VM that is gone is
// sandbox.ErrNotFound (qemu-server's "Configuration file ... does not
// exist").
func TestVMStatus(t *testing.T) {
	f, c := newFakeServer(t)
	f.mu.Lock()
	f.vms[120] = map[string]any{"name": "a", "status": "running", "qmpstatus": "guest-panicked"}
	f.vms[121] = map[string]any{"name": "b", "status": "stopped"}
	f.mu.Unlock()
	for _, tc := range []struct {
		vmid int
		want sandbox.VMRunState
		err  error
	}{
		{120, sandbox.VMRunState{Status: "running", QMPStatus: "guest-panicked"}, nil},
		{121, sandbox.VMRunState{Status: "stopped"}, nil},
		{404, sandbox.VMRunState{}, sandbox.ErrNotFound},
	} {
		got, err := c.VMStatus(context.Background(), tc.vmid)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("vm %d: %+v %v, want %+v %v", tc.vmid, got, err, tc.want, tc.err)
		}
	}
}
