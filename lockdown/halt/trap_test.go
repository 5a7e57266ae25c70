package halt_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// apiConfig turns the sandbox API on against the node's own Proxmox API
// (pveproxy at 127.0.0.1:8006): when the node is halted, pveproxy is masked
// and nothing listens there.
const apiConfig = `[guard]
mgmt_rules = false
[api]
enabled = true
[api.proxmox]
url = "https://127.0.0.1:8006/api2/json"
secret_file = "/etc/pve-inspectd/pve-token"
ca_file = ""
`

// defaultRoute gives the container's network namespace a default route.
func defaultRoute(t *testing.T, c *sysbox.Container) {
	t.Helper()
	pid := fmt.Sprint(c.PID())
	for _, args := range [][]string{
		{"link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1"},
		{"link", "set", "uplink1", "up"},
		{"link", "set", "uplink0", "up"},
		{"addr", "add", "192.0.2.2/24", "dev", "uplink0"},
		{"route", "add", "default", "via", "192.0.2.1"},
	} {
		if b, err := exec.Command("nsenter", append([]string{"-t", pid, "-n", "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, b)
		}
	}
}

// startDaemon runs `pve-inspectd run` with the API on as a Type=notify
// unit; systemd-run returns once the daemon sent READY=1, and fails when
// the daemon exits first.
func startDaemon(t *testing.T, c *sysbox.Container, unit string) {
	t.Helper()
	out, err := c.Exec(context.Background(), "systemd-run", "--unit="+unit, "--collect", "-p", "Type=notify",
		"-p", "TimeoutStartSec=60", "pve-inspectd", "-c", "/etc/pve-inspectd/api.toml", "run")
	if err != nil {
		t.Fatalf("daemon did not become ready while the node is halted: %v %s\n%s", err, out, journal(c, unit))
	}
}

// TestHaltedNodeDaemonRestartRecover is the halt trap of issue 13: with the
// node halted (pveproxy masked, so the Proxmox API is down) a daemon with
// the sandbox API on still starts, reports READY and proves the lockdown;
// it survives a restart; and recover lifts the halt.
func TestHaltedNodeDaemonRestartRecover(t *testing.T) {
	c := boot(t)
	ctx := context.Background()
	if err := c.WriteFile(ctx, "/etc/pve-inspectd/api.toml", []byte(apiConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, "/etc/pve-inspectd/pve-token", []byte("00000000-0000-0000-0000-000000000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defaultRoute(t, c)
	if _, err := c.Exec(ctx, "systemctl", "start", "pve-inspectd-halt@auto.service"); err != nil {
		t.Fatalf("halt unit failed: %v\n%s", err, journal(c, "pve-inspectd-halt@auto.service"))
	}
	assertHalted(t, c)

	const unit = "pve-inspectd-trap"
	startDaemon(t, c, unit)
	waitInForce(t, c, unit)
	// The API tries Proxmox beside the guard and the lockdown, so its
	// first failure may be logged after the lockdown is proved.
	if j := journalSays(c, unit, "sandbox api unavailable; retrying", 30*time.Second); j != "" {
		t.Errorf("the daemon's journal does not say the API waits for Proxmox:\n%s", j)
	}
	// Restart: the daemon comes back while Proxmox is still down.
	if out, err := c.Exec(ctx, "systemctl", "stop", unit); err != nil {
		t.Fatalf("stop: %v %s", err, out)
	}
	startDaemon(t, c, unit)
	waitInForce(t, c, unit)
	assertHalted(t, c)

	if out, err := c.Exec(ctx, "pve-inspectd", "recover"); err != nil {
		t.Fatalf("recover with the daemon running and the cause gone: %v %s", err, out)
	} else if !strings.Contains(string(out), "recovered") {
		t.Errorf("recover said %q", out)
	}
	assertRunning(t, c)
	if p, err := c.SystemctlShow(ctx, unit+".service", "ActiveState"); err != nil || p["ActiveState"] != "active" {
		t.Errorf("daemon after recover: %v %v\n%s", p, err, journal(c, unit))
	}
	if _, err := c.Exec(ctx, "systemctl", "stop", unit); err != nil {
		t.Fatal(err)
	}
}

// waitInForce waits until `pve-inspectd lockdown status` reports the
// lockdown proven in force by the running daemon.
// journalSays waits up to wait for unit's journal to contain line; it
// returns "" once it does, else the journal.
func journalSays(c *sysbox.Container, unit, line string, wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		j := journal(c, unit)
		if strings.Contains(j, line) {
			return ""
		}
		if time.Now().After(deadline) {
			return j
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitInForce(t *testing.T, c *sysbox.Container, unit string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.Exec(context.Background(), "pve-inspectd", "lockdown", "status")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never proved the lockdown: %v %s\n%s", err, out, journal(c, unit))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
