package sandboxapi_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/qga/wintest"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestWindowsStreamIsCollected: a streamed exec reserves nothing of the
// collected-output quota on Linux, where its output leaves the daemon
// while the command runs; a Windows VM's ExecStream collects the whole
// output first (qemu-ga hands it over only at exit) and writes it
// afterwards, so it reserves 2 x min(output_limit, 16 MiB) as a collected
// exec does, and one that could never fit the owner's share is refused
// (400 on output_limit) before anything runs. Here the owner's and the
// node's collected share is 4 MiB.
func TestWindowsStreamIsCollected(t *testing.T) {
	fake := wintest.New(t)
	qc := qga.New(qga.Options{})
	e := newEnv(t, func(o *options) {
		o.AllowWindows = true
		o.CollectedBytes, o.OwnerCollectedBytes = 4<<20, 4<<20
		o.WinGuests = func(string) sandbox.Guest { return qc.WindowsGuests()(fake.Socket) }
	})
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "win", Template: "debian", OSType: "win11"}}})
	var out, errb bytes.Buffer
	res, err := e.c.ExecStream(e.ctx(), sb.ID, "win", apitype.ExecRequest{Argv: []string{"big.exe", "6291456"}, OutputLimit: 8 << 20}, &out, &errb)
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Status != 400 || p.Type != apitype.ProblemInvalidRequest || p.Field != "output_limit" {
		t.Fatalf("a streamed Windows exec reserving 16 MiB with a collected share of 4 MiB: %+v, %v (%d bytes out); want 400 invalid-request on output_limit", res, err, out.Len()+errb.Len())
	}
	if n := len(fake.Execs()); n != 0 {
		t.Errorf("refused, yet %d guest-execs ran", n)
	}
	out.Reset()
	errb.Reset()
	res, err = e.c.ExecStream(e.ctx(), sb.ID, "win", apitype.ExecRequest{Argv: []string{"big.exe", "1000"}, OutputLimit: 1 << 20}, &out, &errb)
	if err != nil || res.ExitCode != 0 || out.Len() == 0 {
		t.Errorf("a streamed Windows exec within the share: %+v, %v, %d bytes out", res, err, out.Len())
	}
}
