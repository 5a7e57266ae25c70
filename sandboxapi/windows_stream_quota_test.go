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

// TestReviewWindowsStreamIsCollected (review 48c of win37): a streamed
// exec reserves nothing of the collected-output quota, because on Linux
// its output leaves the daemon while the command runs. A Windows VM's
// ExecStream (qga.WinGuest, winStream) collects the whole output first
// (qemu-ga hands it over only at exit) and writes it afterwards, so each
// streamed Windows exec holds up to 2 x min(output_limit, 16 MiB)
// decoded bytes (plus their base64 text while parsing) with no
// reservation: an owner's exec slots (8) or the node's (32) open
// streamed Windows execs past collected_bytes / owner_collected_bytes.
// Here the owner's and the node's collected share is 4 MiB and one
// streamed exec holds 12 MiB. Fix: for a Windows VM, reserve a streamed
// exec like a collected one (2 x min(output_limit, agent cap) in
// s.collected), refusing as the collected path does.
func TestReviewWindowsStreamIsCollected(t *testing.T) {
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
	if errors.As(err, &p) {
		t.Logf("refused: %v", err)
		return // refused against the collected quota: fixed
	}
	t.Errorf("a streamed Windows exec holding %d bytes of output ran with a collected share of %d: %+v, %v",
		out.Len()+errb.Len(), 4<<20, res, err)
}
