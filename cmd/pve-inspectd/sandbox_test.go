package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// passChecker reports one passing row.
type passChecker struct{ pass bool }

func (p passChecker) Run(context.Context, sandbox.CheckTarget) (apitype.CheckReport, error) {
	return apitype.CheckReport{Pass: p.pass, Rows: []apitype.CheckRow{{Target: "host api", Probe: "tcp 8006", Expected: "blocked", Observed: "blocked", Pass: p.pass}}}, nil
}

// startAPI serves the API on fakes over a unix socket in a temp dir.
func startAPI(t *testing.T, pass bool) string {
	t.Helper()
	sock, _, _ := startAPIWith(t, pass, nil)
	return sock
}

// startAPIOn is startAPI that also returns the engine and the fake
// Proxmox behind the socket.
func startAPIOn(t *testing.T, pass bool) (string, *sandbox.Engine, *apitest.Proxmox) {
	t.Helper()
	return startAPIWith(t, pass, nil)
}

// startAPIWith serves an engine on the fakes whose options mod changes,
// and returns the engine and the fake Proxmox too.
func startAPIWith(t *testing.T, pass bool, mod func(*sandbox.Options)) (string, *sandbox.Engine, *apitest.Proxmox) {
	t.Helper()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	o := sandbox.Options{
		Node:     "n1",
		Proxmox:  px,
		Guests:   g.Dial,
		Checker:  passChecker{pass},
		StateDir: t.TempDir(),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&o)
	}
	eng, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := sandboxapi.ListenUnix(sock, "", 0o660)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sandboxapi.Serve(ctx, ln, srv.LocalHandler()); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock, eng, px
}

// TestSandboxListPool: `sandbox list --pool` shows the shapes and the
// unclaimed members; a plain `sandbox create` claims one.
func TestSandboxListPool(t *testing.T) {
	sock, eng, _ := startAPIWith(t, true, func(o *sandbox.Options) {
		o.WarmPool = []sandbox.PoolShape{{Name: "small", Template: "debian", Target: 2}}
	})
	eng.MaintainPool(context.Background())
	members := eng.Pool().Members
	if len(members) != 2 {
		t.Fatalf("members %+v", members)
	}
	out, err := run(t, "", "sandbox", "list", "--socket", sock, "--pool")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^small\s+vm\s+debian\s+1\s+1024 MiB\s+open\s+2\s+0\s+2$`).MatchString(out) ||
		!strings.Contains(out, members[0].ID) || !strings.Contains(out, members[1].ID) {
		t.Fatalf("list --pool:\n%s", out)
	}
	out, err = run(t, "", "sandbox", "create", "--socket", sock, "--template", "debian")
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || !sb.FromPool || sb.ID != members[0].ID && sb.ID != members[1].ID {
		t.Fatalf("create output %q: %v, want a member claimed", out, err)
	}
	out, err = run(t, "", "sandbox", "list", "--socket", sock, "--pool", "--json")
	var st apitype.PoolStatus
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Members) != 1 || st.Shapes[0].Ready != 1 || st.Members[0].ID == sb.ID {
		t.Fatalf("list --pool --json after a claim: %q %v", out, err)
	}
}

// run executes the CLI and returns stdout and the error.
func run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestSandboxVerbs(t *testing.T) {
	sock := startAPI(t, true)
	out, err := run(t, "", "sandbox", "create", "--socket", sock, "--template", "debian", "--template", "debian", "--label", "eval=x", "--ttl", "1h")
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || len(sb.VMs) != 2 || sb.Labels["eval"] != "x" {
		t.Fatalf("create output %q: %v", out, err)
	}
	out, err = run(t, "", "sandbox", "list", "--socket", sock)
	if err != nil || !strings.Contains(out, sb.ID) || !strings.Contains(out, "ready") {
		t.Fatalf("list: %q %v", out, err)
	}
	// each VM with its id and IPAM address
	for _, v := range sb.VMs {
		if len(v.Addresses) != 1 || !strings.Contains(out, fmt.Sprintf("%s(%d %s)", v.Name, v.VMID, v.Addresses[0].IPv4)) {
			t.Errorf("list %q: want %s with its vmid and address %+v", out, v.Name, v.Addresses)
		}
	}
	out, err = run(t, "", "sandbox", "exec", "--socket", sock, sb.ID, "vm1", "--", "echo", "hello")
	if err != nil || out != "hello\n" {
		t.Fatalf("exec: %q %v", out, err)
	}
	_, err = run(t, "", "sandbox", "exec", "--socket", sock, sb.ID, "vm1", "--", "fail", "7")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 7 {
		t.Fatalf("exec exit code: %v", err)
	}
	local := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(local, []byte("payload"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "", "sandbox", "cp", "--socket", sock, local, sb.ID+":vm0:/root/f"); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "", "sandbox", "cp", "--socket", sock, sb.ID+":vm0:/root/f", "-")
	if err != nil || out != "payload" {
		t.Fatalf("cp out: %q %v", out, err)
	}
	back := filepath.Join(t.TempDir(), "back")
	if _, err := run(t, "", "sandbox", "cp", "--socket", sock, sb.ID+":vm0:/root/f", back); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(back); string(b) != "payload" {
		t.Fatalf("cp to file: %q", b)
	}
	if _, err := run(t, "", "sandbox", "cp", "--socket", sock, sb.ID+":vm0:/nope", back); err == nil || !strings.Contains(err.Error(), "file-not-found") {
		t.Fatalf("cp of a missing file: %v", err)
	}
	out, err = run(t, "", "check", "--socket", sock, sb.ID)
	if err != nil || !strings.Contains(out, "PASS") {
		t.Fatalf("check: %q %v", out, err)
	}
	if _, err := run(t, "", "sandbox", "delete", "--socket", sock, sb.ID, sb.ID); err != nil {
		t.Fatal(err)
	}
	out, _ = run(t, "", "sandbox", "list", "--socket", sock, "--json")
	if strings.TrimSpace(out) != "[]" && strings.TrimSpace(out) != "null" {
		t.Fatalf("list after delete: %q", out)
	}
}

// TestSandboxCreateNoNetwork: --no-network-template adds a VM without
// any NIC (no_network), beside a --template VM; the list shows it with
// its vmid and "no network", no address.
func TestSandboxCreateNoNetwork(t *testing.T) {
	sock, _, px := startAPIOn(t, true)
	out, err := run(t, "", "sandbox", "create", "--socket", sock, "--template", "debian", "--no-network-template", "debian")
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil || len(sb.VMs) != 2 || sb.VMs[0].NoNetwork || !sb.VMs[1].NoNetwork {
		t.Fatalf("create output %q: %v, want vm0 on a network and vm1 without", out, err)
	}
	if v, _ := px.VMByID(sb.VMs[1].VMID); len(v.Config.Bridges) != 0 {
		t.Errorf("vm1 configured on %v, want no bridge", v.Config.Bridges)
	}
	out, err = run(t, "", "sandbox", "list", "--socket", sock)
	if want := fmt.Sprintf("vm1(%d no network)", sb.VMs[1].VMID); err != nil || !strings.Contains(out, want) {
		t.Fatalf("list %q (%v): want %s", out, err, want)
	}
}

func TestCheckFailsExitCode(t *testing.T) {
	sock := startAPI(t, false)
	out, err := run(t, "", "sandbox", "create", "--socket", sock, "--template", "debian")
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	_ = json.Unmarshal([]byte(out), &sb)
	out, err = run(t, "", "check", "--socket", sock, sb.ID)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(out, "FAIL") {
		t.Fatalf("failing check: %q %v", out, err)
	}
}

func TestTokenVerbs(t *testing.T) {
	f := filepath.Join(t.TempDir(), "tokens.json")
	tok, err := run(t, "", "token", "create", "harness", "--scope", "exec,read", "--token-file", f)
	if err != nil || !strings.HasPrefix(tok, "pvei_") {
		t.Fatalf("create: %q %v", tok, err)
	}
	out, err := run(t, "", "token", "list", "--token-file", f)
	if err != nil || !strings.Contains(out, "harness") || !strings.Contains(out, "exec,read") || strings.Contains(out, strings.TrimSpace(tok)) {
		t.Fatalf("list: %q %v", out, err)
	}
	if _, err := run(t, "", "token", "revoke", "harness", "--token-file", f); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "", "token", "create", "x", "--scope", "root", "--token-file", f); err == nil {
		t.Fatal("bad scope accepted")
	}
}
