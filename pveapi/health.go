package pveapi

import (
	"context"
	"fmt"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

var _ sandbox.VMStatusReader = (*Client)(nil)

// runState is the part of GET .../status/current the health monitor
// reads: qemu-server's vmstatus reports "status" from the VM's process
// and, with full=1 semantics of the status/current call, "qmpstatus" from
// QMP query-status (PVE::QemuServer::vmstatus: $d->{qmpstatus} =
// $qmpstatus->{status}), so a guest-panicked or internal-error VM shows
// here while its process still runs.
type runState struct {
	Status    string `json:"status"`
	QMPStatus string `json:"qmpstatus"`
}

// VMStatus implements sandbox.VMStatusReader: one GET of
// .../status/current (no pool lookup, unlike VM).
func (c *Client) VMStatus(ctx context.Context, vmid int) (sandbox.VMRunState, error) {
	var v runState
	if err := c.c.Get(ctx, c.qemu(vmid)+"/status/current", &v); err != nil {
		return sandbox.VMRunState{}, classify(fmt.Sprintf("read status of vm %d", vmid), err)
	}
	return sandbox.VMRunState{Status: v.Status, QMPStatus: v.QMPStatus}, nil
}
