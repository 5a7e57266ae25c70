package e2e_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestCreateDiskSmallerThanTemplate: a disk_gib smaller than the
// template's boot disk (the emulator's debian: scsi0 size=8G) reached
// Proxmox, which refuses to shrink ("shrinking disks is not supported"),
// and came back 502 after the clone. It is refused up front now: 400, the
// field named, nothing cloned; the template's size and more are accepted.
func TestCreateDiskSmallerThanTemplate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(true))
	tests := []struct {
		disks []int
		field string // the refused field; "" for accepted
	}{
		{[]int{7}, "vms[0].disk_gib"},
		{[]int{1}, "vms[0].disk_gib"},
		{[]int{0, 4}, "vms[1].disk_gib"},
		{[]int{8}, ""},
		{[]int{0, 9}, ""},
	}
	for _, tc := range tests {
		var req apitype.CreateRequest
		for _, d := range tc.disks {
			req.VMs = append(req.VMs, apitype.VMRequest{Template: "debian", DiskGiB: d})
		}
		sb, err := e.c.Create(ctx, req)
		if tc.field == "" {
			if err != nil {
				t.Errorf("disks %v: %v", tc.disks, err)
				continue
			}
			if err := e.c.Delete(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var p *apitype.Problem
		if !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || p.Status != 400 || p.Field != tc.field {
			t.Errorf("disks %v: %v (%+v), want invalid-request 400 of field %s", tc.disks, err, p, tc.field)
		}
		if l, err := e.c.List(ctx); err != nil || len(l) != 0 {
			t.Errorf("disks %v: sandboxes after the refusal: %v %v", tc.disks, l, err)
		}
	}
}
