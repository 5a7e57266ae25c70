package e2e_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// victimTemplate adds template 9002 "victim", as an OVA of an old
// VulnHub image imports: its disk on ide0 (no scsi0), an e1000 NIC, no
// agent key.
func victimTemplate(t *testing.T, e *emuEnv) {
	t.Helper()
	addGrantedTemplate(t, e, 9002, "victim", map[string]string{
		"scsi0": "", "scsihw": "", "agent": "", "ide0": "local-lvm:base-9002-disk-0,size=8G",
		"net0": "e1000=BC:24:11:00:00:03,bridge=vmbr0",
	})
}

// TestAgentlessOnEmulator: the reference plugin's CTF on the emulator,
// with the daemon's pool-scoped token and the hardened profile checked on
// every clone: a target of an ide template on an e1000 NIC, created with
// agent false, listed first, and an attacker. The sandbox is ready with
// no agent on the target: its clone has the agent off (so the emulator,
// as qemu-server, starts it without an agent socket) and every NIC
// e1000, in the profile as the options want it; its exec, file and check
// calls are refused with a conflict naming it, and a rollback of it
// returns once it runs again. disk_controller "ide" of a template whose
// disks are on scsi is refused, the field named.
func TestAgentlessOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false), func(o *options) { o.AllowE1000 = true })
	victimTemplate(t, e)

	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "target", Template: "victim", Agent: new(bool), NICController: "e1000", DiskController: "ide"},
		{Name: "attacker", Template: "debian"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != apitype.StateReady || sb.VMs[0].HasAgent() || !sb.VMs[1].HasAgent() || sb.VMs[0].DiskController != "ide" {
		t.Fatalf("sandbox %+v", sb)
	}
	target, attacker := sb.VMs[0].VMID, sb.VMs[1].VMID
	conf, err := e.px.VMConfig(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if conf["agent"] != "0" || !strings.HasPrefix(conf["net0"], "e1000=") || conf["scsi0"] != "" || conf["ide0"] == "" {
		t.Errorf("target's config: agent %q net0 %q scsi0 %q ide0 %q", conf["agent"], conf["net0"], conf["scsi0"], conf["ide0"])
	}
	if f := hardening.CheckFor(conf, hardening.Want{NIC: hardening.NICE1000, NoAgent: true}).Failed(); len(f) != 0 {
		t.Errorf("target not in the profile its options want: %v", f)
	}
	if a, err := e.px.VMConfig(ctx, attacker); err != nil || !strings.HasPrefix(a["net0"], "virtio=") || len(hardening.CheckFor(a, hardening.Want{}).Failed()) != 0 {
		t.Errorf("attacker's config: net0 %q agent %q (%v), want in the default profile", a["net0"], a["agent"], err)
	}
	if _, err := os.Stat(filepath.Join(e.run, strconv.Itoa(target)+".qga")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the target has an agent socket (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(e.run, strconv.Itoa(attacker)+".qga")); err != nil {
		t.Errorf("the attacker has no agent socket: %v", err)
	}

	var p *apitype.Problem
	for what, call := range map[string]func() error{
		"exec": func() error {
			_, err := e.c.Exec(ctx, sb.ID, "target", apitype.ExecRequest{Argv: []string{"true"}})
			return err
		},
		"read": func() error { _, err := e.c.ReadFile(ctx, sb.ID, "target", "/etc/motd", io.Discard); return err },
		"write": func() error {
			return e.c.WriteFile(ctx, sb.ID, "target", "/tmp/x", strings.NewReader("x"), 1, 0o644)
		},
		"check": func() error { _, err := e.c.Check(ctx, sb.ID, "target"); return err },
	} {
		if err := call(); !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "vm target has no guest agent") {
			t.Errorf("%s on the target: %v, want 409 naming it", what, err)
		}
	}
	// the attacker's exec goes to its guest (emuguest runs none: the
	// bed's test runs it), not refused for want of an agent
	if _, err := e.c.Exec(ctx, sb.ID, "attacker", apitype.ExecRequest{Argv: []string{"true"}}); !errors.As(err, &p) || p.Type != apitype.ProblemGuestUnavailable {
		t.Errorf("exec in the attacker: %v, want it tried in the guest", err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "target", "clean"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Rollback(ctx, sb.ID, "target", "clean"); err != nil {
		t.Fatalf("rollback of the target: %v", err)
	}

	_, err = e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", DiskController: "ide"}}})
	if !errors.As(err, &p) || p.Status != 400 || p.Field != "vms[0].disk_controller" || !strings.Contains(p.Detail, "its disks are on scsi") {
		t.Errorf("disk_controller ide of the scsi template: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
}
