package sandboxapi_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/qga/wintest"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestWindowsGuestThroughAPI: a Windows VM's exec and file calls go
// through the API to its agent (wintest's fake of qemu-ga's Windows
// build: no real Windows guest exists here), with Windows paths; its
// Linux sibling keeps the Linux guest; the containment check stays
// refused from the Windows VM.
func TestWindowsGuestThroughAPI(t *testing.T) {
	fake := wintest.New(t)
	qc := qga.New(qga.Options{})
	var dialed []string
	e := newEnv(t, func(o *options) {
		o.AllowWindows = true
		o.WinGuests = func(socket string) sandbox.Guest {
			dialed = append(dialed, socket)
			return qc.WindowsGuests()(fake.Socket)
		}
	})
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "linux", Template: "debian"},
		{Name: "win", Template: "debian", OSType: "win11"},
	}})
	ctx := e.ctx()

	res, err := e.c.Exec(ctx, sb.ID, "win", apitype.ExecRequest{Argv: []string{"cmd.exe", "/c", "echo hello & goodbye\npwd.exe"}, Cwd: `C:\Users`})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "hello & goodbye\r\nC:\\Users\r\n" || res.ExitCode != 0 {
		t.Errorf("shell string: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	var out bytes.Buffer
	sres, err := e.c.ExecStream(ctx, sb.ID, "win", apitype.ExecRequest{Argv: []string{"echo.exe", "a b"}}, &out, nil)
	if err != nil || out.String() != "a b\r\n" || sres.ExitCode != 0 {
		t.Errorf("streamed argv exec: %q, %+v, %v", out.String(), sres, err)
	}

	body := []byte("line one\r\nline two\r\n")
	if err := e.c.WriteFile(ctx, sb.ID, "win", `C:\Users\agent\notes.txt`, bytes.NewReader(body), int64(len(body)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := fake.File(`C:\Users\agent\notes.txt`); !bytes.Equal(got, body) {
		t.Errorf("guest file %q", got)
	}
	var back bytes.Buffer
	if _, err := e.c.ReadFile(ctx, sb.ID, "win", `C:/Users/agent/notes.txt`, &back); err != nil || !bytes.Equal(back.Bytes(), body) {
		t.Errorf("read back %q, %v", back.Bytes(), err)
	}

	// refusals, each with its reason
	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		has    string
	}{
		{"user", func() error {
			_, err := e.c.Exec(ctx, sb.ID, "win", apitype.ExecRequest{Argv: []string{"echo.exe"}, User: "bob"})
			return err
		}, 400, "user is not supported"},
		{"POSIX cwd", func() error {
			_, err := e.c.Exec(ctx, sb.ID, "win", apitype.ExecRequest{Argv: []string{"echo.exe"}, Cwd: "/tmp"})
			return err
		}, 400, "drive-absolute Windows path"},
		{"POSIX path", func() error {
			_, err := e.c.ReadFile(ctx, sb.ID, "win", "/etc/hosts", &bytes.Buffer{})
			return err
		}, 400, "drive-absolute Windows path"},
		{"missing file", func() error {
			_, err := e.c.ReadFile(ctx, sb.ID, "win", `C:\nope.txt`, &bytes.Buffer{})
			return err
		}, 404, ""},
		{"containment check", func() error {
			_, err := e.c.Check(ctx, sb.ID, "win")
			return err
		}, 409, "probes are Linux programs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p *apitype.Problem
			if err := tc.call(); !errors.As(err, &p) || p.Status != tc.status || !strings.Contains(p.Detail, tc.has) {
				t.Errorf("got %v, want %d with %q", err, tc.status, tc.has)
			}
		})
	}

	// the Linux VM keeps the Linux guest
	n := len(dialed)
	if res, err := e.c.Exec(ctx, sb.ID, "linux", apitype.ExecRequest{Argv: []string{"echo", "hi"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("linux exec: %+v, %v", res, err)
	}
	if len(dialed) != n {
		t.Error("the Linux VM's exec dialed the Windows guest client")
	}
	for _, s := range dialed {
		if !strings.HasSuffix(s, ".qga") {
			t.Errorf("dialed %q", s)
		}
	}
}

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
