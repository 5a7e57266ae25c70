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
