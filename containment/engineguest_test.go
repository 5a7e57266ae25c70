package containment

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// engineFake is a sandbox.Guest that records its execs and answers with
// res, writing stderr to the stream's writer.
type engineFake struct {
	got    []sandbox.GuestExec
	res    apitype.ExecResult
	stderr string
}

func (f *engineFake) Ping(context.Context) error { return nil }
func (f *engineFake) Exec(_ context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	f.got = append(f.got, r)
	res := f.res
	res.Stderr = []byte(f.stderr)
	return &res, nil
}
func (f *engineFake) ExecStream(_ context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	f.got = append(f.got, r)
	_, _ = stdout.Write(f.res.Stdout)
	_, _ = io.WriteString(stderr, f.stderr)
	res := f.res
	res.Stdout = nil
	return &res, nil
}
func (f *engineFake) WriteFile(context.Context, string, io.Reader, os.FileMode) error { return nil }
func (f *engineFake) ReadFile(context.Context, string, io.Writer, int64) (int64, error) {
	return 0, nil
}

// TestEngineGuest: a container's probe runs through the engine's guest:
// the timeout rounded up to whole seconds, each stream capped one byte
// over the report's bound, stderr streamed, and a timed-out run an error.
func TestEngineGuest(t *testing.T) {
	ctx := context.Background()
	f := &engineFake{res: apitype.ExecResult{Stdout: []byte("{}"), ExitCode: 0}, stderr: "progress\n"}
	g := EngineGuest{Guest: f}
	out, errb, code, err := g.Exec(ctx, []string{"/tmp/p", "req"}, nil, 2500*time.Millisecond)
	if err != nil || string(out) != "{}" || string(errb) != "progress\n" || code != 0 {
		t.Fatalf("exec: %q %q %d %v", out, errb, code, err)
	}
	var w bytes.Buffer
	out, code, err = g.ExecStream(ctx, []string{"/tmp/p"}, nil, time.Second, &w)
	if err != nil || string(out) != "{}" || w.String() != "progress\n" || code != 0 {
		t.Fatalf("stream: %q %q %d %v", out, w.String(), code, err)
	}
	if len(f.got) != 2 || f.got[0].Timeout != 3 || f.got[1].Timeout != 1 || f.got[0].OutputLimit != probe.MaxReportBytes+1 ||
		f.got[0].Argv[0] != "/tmp/p" || f.got[0].User != "" {
		t.Fatalf("execs %+v", f.got)
	}
	f.res.TimedOut = true
	if _, _, _, err := g.Exec(ctx, []string{"/tmp/p"}, nil, time.Second); err == nil || !strings.Contains(err.Error(), "probe killed after") {
		t.Errorf("a timed-out exec: %v", err)
	}
	if _, _, err := g.ExecStream(ctx, []string{"/tmp/p"}, nil, time.Second, io.Discard); err == nil || !strings.Contains(err.Error(), "probe killed after") {
		t.Errorf("a timed-out stream: %v", err)
	}
}

// TestCheckerGuest: a VM's probe goes through its agent socket, a
// container's through the engine's guest of it (and without one the
// check says so rather than dial an agent the container has not).
func TestCheckerGuest(t *testing.T) {
	c := &SandboxChecker{Client: qga.New(qga.Options{}), QGADir: "/run/qga"}
	f := &engineFake{}
	vm, err := c.guest(sandbox.CheckTarget{VM: apitype.VM{Name: "vm", VMID: 101}, Guest: f})
	if _, ok := vm.(AgentGuest); err != nil || !ok {
		t.Errorf("a VM's guest %T, %v", vm, err)
	}
	ct, err := c.guest(sandbox.CheckTarget{VM: apitype.VM{Name: "ct", VMID: 102, Kind: apitype.KindLXC}, Guest: f})
	if eg, ok := ct.(EngineGuest); err != nil || !ok || eg.Guest != f {
		t.Errorf("a container's guest %T, %v", ct, err)
	}
	if _, err := c.guest(sandbox.CheckTarget{VM: apitype.VM{Name: "ct", VMID: 102, Kind: apitype.KindLXC}}); err == nil {
		t.Error("a container without a guest got one")
	}
}
