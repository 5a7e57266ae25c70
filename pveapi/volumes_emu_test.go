package pveapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/diskxfer"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestFailedHotplugLeavesNoReference: a disk transfer whose hot-plug
// Proxmox refuses (qemu-server keeps the disk pending and fails the task
// with "hotplug problem") returns an error that says so, and afterwards
// no key of the VM's config, current or pending, names the image it
// freed, and the image is gone: the VM's next start would otherwise fail
// on the missing volume. The daemon's own token (pve-access-setup's
// grants) does every step.
func TestFailedHotplugLeavesNoReference(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, c := oneNodeAs(t, ctx, nil, func(s *pveemu.Server) (string, string, error) {
		return s.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{9000}, Transfer: access.TransferStorage})
	})
	if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "sbx", Pool: access.DefaultPool}); err != nil {
		t.Fatal(err)
	}
	if err := c.StartVM(ctx, 100); err != nil {
		t.Fatal(err)
	}
	s.FailNextHotplug(100, "error on hotplug device 'virtioscsi1'")
	tr := diskxfer.New(c, diskxfer.Options{Storage: access.TransferStorage})
	err := tr.Upload(ctx, 100, nil, "/root/f", strings.NewReader("x"), 1, 0o644)
	if err == nil || !strings.Contains(err.Error(), "hot-plug of the transfer disk into VM 100") || !strings.Contains(err.Error(), "hotplug problem - error on hotplug device 'virtioscsi1'") {
		t.Errorf("upload: %v, want the refused hot-plug named", err)
	}
	cur, pend, err := c.DiskConfig(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	var pending []map[string]any
	if err := c.Get(ctx, "/nodes/pve/qemu/100/pending", &pending); err != nil {
		t.Fatal(err)
	}
	for _, where := range []struct {
		name string
		vals any
	}{{"current config", cur}, {"config with pending", pend}, {"GET pending", pending}} {
		if s := fmt.Sprint(where.vals); strings.Contains(s, "-pvei-") {
			t.Errorf("%s names a transfer image: %s", where.name, s)
		}
	}
	s.SetStorageContent(access.TransferStorage, "images")
	if vols, err := c.ImageVolumes(ctx, access.TransferStorage); err != nil || len(vols) != 0 {
		t.Errorf("images left: %v %v", vols, err)
	}
}
