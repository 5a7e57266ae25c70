package kvm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// qmp is a minimal QMP client for the test.
type qmp struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var c net.Conn
	var err error
	for ctx.Err() == nil {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c == nil {
		return nil, fmt.Errorf("qmp %s: %v", path, err)
	}
	q := &qmp{c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // greeting
		return nil, err
	}
	if _, err := q.do("qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *qmp) do(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	if err := json.NewEncoder(q.c).Encode(req); err != nil {
		return nil, err
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var resp struct {
			Return json.RawMessage        `json:"return"`
			Error  *struct{ Desc string } `json:"error"`
			Event  string                 `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, err
		}
		if resp.Event != "" {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("%s: %s", cmd, resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

// TestQEMUAcceptsGeneratedArgs starts QEMU (TCG, paused, no guest code
// runs) with the generated command line and asks it over QMP what it built:
// both drives with the right formats (the seed read-only) and both host
// forwards. This runs without a guest kernel.
func TestQEMUAcceptsGeneratedArgs(t *testing.T) {
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not installed (CI)", bin)
			}
			t.Skipf("SKIPPING: %s not installed", bin)
		}
	}
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	seed := filepath.Join(dir, "seed.iso")
	if err := WriteSeedISO(seed, Seed{UserData: []byte("#cloud-config\n"), MetaData: MetaData("argtest-1", "argtest")}); err != nil {
		t.Fatal(err)
	}
	fw := []Forward{
		{Name: "proxmox-api", HostAddr: "127.0.0.1", HostPort: freePort(t), GuestPort: 8006},
		{Name: "sandbox-api", HostAddr: "127.0.0.1", HostPort: freePort(t), GuestPort: 8443},
	}
	spec := VMSpec{Name: "argtest", Disk: disk, Seed: seed, CPUs: 1, MemoryMiB: 256, Accel: "tcg", Forwards: fw,
		SerialLog: filepath.Join(dir, "serial.log"), PIDFile: filepath.Join(dir, "qemu.pid"), QMPSocket: filepath.Join(dir, "qmp.sock")}
	args, err := spec.Args()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := exec.CommandContext(ctx, "qemu-system-x86_64", append(args, "-S")...)
	out := &strings.Builder{}
	q.Stdout, q.Stderr = out, out
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Process.Kill(); q.Wait() })
	m, err := dialQMP(ctx, spec.QMPSocket)
	if err != nil {
		t.Fatalf("%v\nqemu: %s", err, out)
	}
	defer m.c.Close()
	raw, err := m.do("query-block", nil)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []struct {
		Inserted *struct {
			File string `json:"file"`
			Drv  string `json:"drv"`
			RO   bool   `json:"ro"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, b := range blocks {
		if b.Inserted != nil {
			got[b.Inserted.File] = fmt.Sprintf("%s ro=%v", b.Inserted.Drv, b.Inserted.RO)
		}
	}
	if got[disk] != "qcow2 ro=false" || got[seed] != "raw ro=true" {
		t.Errorf("drives: %v", got)
	}
	raw, err = m.do("human-monitor-command", map[string]string{"command-line": "info usernet"})
	if err != nil {
		t.Fatal(err)
	}
	var usernet string
	json.Unmarshal(raw, &usernet)
	t.Logf("info usernet:\n%s", usernet)
	for _, f := range fw {
		re := regexp.MustCompile(fmt.Sprintf(`TCP\[HOST_FORWARD\]\s+\d+\s+127\.0\.0\.1\s+%d\s+10\.0\.2\.15\s+%d\s`, f.HostPort, f.GuestPort))
		if !re.MatchString(usernet) {
			t.Errorf("forward %d->%d missing:\n%s", f.HostPort, f.GuestPort, usernet)
		}
	}
	// The forwarded ports are really bound on the host.
	for _, f := range fw {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", f.HostPort), 5*time.Second)
		if err != nil {
			t.Errorf("host port %d not listening: %v", f.HostPort, err)
			continue
		}
		c.Close()
	}
}
