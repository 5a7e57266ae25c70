package pveemu

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestGoProxmoxLifecycleOnBed runs the go-proxmox lifecycle against the
// emulator wired to the real test bed: real bridges, dnsmasq, guest
// namespaces and qemu-ga; afterwards nothing the VMs or zones made is left.
func TestGoProxmoxLifecycleOnBed(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bed, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.Close() })
	data := filepath.Join(bed.Dir(), "pveemu")
	s, err := New(Options{Node: "pve", Backend: BedBackend{Bed: bed}, DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(s)
	t.Cleanup(func() { ts.Close(); _ = s.Close() })
	tdisk := filepath.Join(bed.Dir(), "template-disk")
	if err := os.MkdirAll(filepath.Join(tdisk, "upper", "var", "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTemplate(ctx, templateID, "tmpl", tdisk, map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=vnet1"}); err != nil {
		t.Fatal(err)
	}
	ticket, csrf := s.RootTicket()
	e := &env{t: t, s: s, ts: ts, ticket: ticket, csrf: csrf}
	var mu sync.Mutex
	sent := 0
	c := lifecycleClient(e, &sent, &mu)
	runLifecycle(t, ctx, c, templateID, "sbx1", "vnet1", "10.10.1.0/24", "10.10.1.1", "10.10.1.100", "10.10.1.200")

	mu.Lock()
	defer mu.Unlock()
	if v := s.Violations(); len(v) != 0 {
		for _, r := range v {
			t.Errorf("violation: %s %s: %d %q %v", r.Method, r.Path, r.Status, r.Message, r.Errors)
		}
	}
	if recs := s.Requests(); len(recs) != sent {
		t.Fatalf("client sent %d requests, server recorded %d", sent, len(recs))
	}
	for _, r := range s.Requests() {
		if r.Status != http.StatusOK {
			t.Errorf("%s %s: %d %q", r.Method, r.Path, r.Status, r.Message)
		}
	}
	// Nothing left behind: guests, their namespaces and sockets, the
	// bridge, the dnsmasq.
	for _, id := range []int{100, 101} {
		if _, ok := bed.Guest(id); ok {
			t.Errorf("guest %d still running", id)
		}
		if _, err := os.Stat(BedBackend{Bed: bed}.AgentSocket(id)); err == nil {
			t.Errorf("agent socket of %d left", id)
		}
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, bed.Name()+"-g") {
			t.Errorf("guest namespace left: %s", l)
		}
	}
	if err := exec.Command("ip", "-n", bed.NodeNS(), "link", "show", "vnet1").Run(); err == nil {
		t.Error("bridge vnet1 left in the node")
	}
	if pid := bed.DnsmasqPID("sbx1"); pid != 0 {
		t.Errorf("dnsmasq of sbx1 left: %d", pid)
	}
}

// TestAgentDownOnBed kills the real qemu-ga of a running guest and checks
// the agent endpoints answer like Proxmox.
func TestAgentDownOnBed(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bed, e := bedEnv(ctx, t)
	tdisk := filepath.Join(bed.Dir(), "template-disk")
	if err := os.MkdirAll(filepath.Join(tdisk, "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddTemplate(ctx, templateID, "tmpl", tdisk, map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=vnet1"}); err != nil {
		t.Fatal(err)
	}
	e.setupZone()
	e.clone("101")
	if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	e.ok("POST", "/nodes/pve/qemu/101/agent/ping", nil)
	// qemu-ga runs the command as its child: kill the parent, a moment
	// after the agent has answered the exec.
	e.ok("POST", "/nodes/pve/qemu/101/agent/exec", url.Values{"command": {"/bin/sh", "-c", "p=$PPID; (sleep 0.5; kill -9 $p) >/dev/null 2>&1 </dev/null &"}})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r := e.do("POST", "/nodes/pve/qemu/101/agent/ping", nil, authTicket)
		if r.status == 500 && r.reason == "QEMU guest agent is not running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent still answers: %d %q", r.status, r.reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/status/stop", nil); st != "OK" {
		t.Fatalf("stop: %s", st)
	}
	r := e.do("POST", "/nodes/pve/qemu/101/agent/ping", nil, authTicket)
	if r.status != 500 || r.reason != "VM 101 is not running" {
		t.Fatalf("stopped: %d %q", r.status, r.reason)
	}
}

// bedEnv is the emulator on a fresh test bed (BedBackend; both closed
// when the test ends) and an env calling it as root.
func bedEnv(ctx context.Context, t *testing.T) (*testvm.Bed, *env) {
	t.Helper()
	return bedEnvWith(ctx, t, testvm.Options{})
}

// bedEnvWith is bedEnv on a bed made with o.
func bedEnvWith(ctx context.Context, t *testing.T, o testvm.Options) (*testvm.Bed, *env) {
	t.Helper()
	bed, err := testvm.Up(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.Close() })
	s, err := New(Options{Node: "pve", Backend: BedBackend{Bed: bed}, DataDir: filepath.Join(bed.Dir(), "pveemu")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(s)
	t.Cleanup(func() { ts.Close(); _ = s.Close() })
	ticket, csrf := s.RootTicket()
	return bed, &env{t: t, s: s, ts: ts, ticket: ticket, csrf: csrf}
}
