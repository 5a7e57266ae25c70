package halt_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// These tests run the real pve-inspectd (static build) inside a sysbox
// container with systemd as PID 1 and real D-Bus.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// daemonBinary builds pve-inspectd statically, once per test binary.
func daemonBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		dir, err := os.MkdirTemp("", "halt-test-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "pve-inspectd")
		cmd := exec.Command("go", "build", "-trimpath", "-o", binPath, "./cmd/pve-inspectd")
		cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build pve-inspectd: %w\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// haltUnit runs the halt like the packaged OnFailure= unit would: as root
// with a bounded capability set and NoNewPrivileges, under the sandboxing
// a hardened unit has. %i names the configuration (and so the transport).
const haltUnit = `[Unit]
Description=pve-inspectd fail-deadly halt, config %i (test)

[Service]
Type=oneshot
ExecStart=/usr/local/bin/pve-inspectd -c /etc/pve-inspectd/%i.toml halt --reason "test: lockdown not enforceable (%i)"
CapabilityBoundingSet=CAP_NET_ADMIN CAP_KILL
AmbientCapabilities=
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
RestrictAddressFamilies=AF_UNIX AF_NETLINK
RuntimeDirectory=pve-inspectd
RuntimeDirectoryPreserve=yes
`

// nobodyUnit is the same halt as an unprivileged user: both paths must
// refuse it, which shows the checks are real.
const nobodyUnit = `[Unit]
Description=pve-inspectd halt as nobody, config %i (test)

[Service]
Type=oneshot
User=nobody
ExecStart=/usr/local/bin/pve-inspectd -c /etc/pve-inspectd/%i.toml halt --reason "test: as nobody (%i)"
NoNewPrivileges=yes
RuntimeDirectory=pve-inspectd
RuntimeDirectoryPreserve=yes
`

var units = []string{"pveproxy.service", "pvedaemon.service"}

const marker = "/etc/inspect-proxmox-egress-lockdown"

func boot(t *testing.T) *sysbox.Container {
	t.Helper()
	testkit.RequireRoot(t)
	bin := daemonBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var files []sysbox.File
	for _, tr := range []string{"auto", "private", "system"} {
		files = append(files, sysbox.File{Path: "/etc/pve-inspectd/" + tr + ".toml",
			Data: []byte("[halt]\ntransport = \"" + tr + "\"\n")})
	}
	c, err := sysbox.Start(ctx, sysbox.Options{
		// PVE_INSPECT_SYSBOX_SUITE=trixie runs these tests on Proxmox VE 9's
		// Debian (systemd 257) instead of the default bookworm.
		Rootfs: sysbox.RootfsOptions{Suite: os.Getenv("PVE_INSPECT_SYSBOX_SUITE")},
		Name:   "halt",
		Units:  map[string]string{"pve-inspectd-halt@.service": haltUnit, "pve-inspectd-halt-nobody@.service": nobodyUnit},
		Files:  files,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close container: %v", err)
		}
	})
	if err := c.CopyIn(ctx, bin, "/usr/local/bin/pve-inspectd"); err != nil {
		t.Fatal(err)
	}
	return c
}

// state returns ActiveState, LoadState and UnitFileState of unit.
func state(t *testing.T, c *sysbox.Container, unit string) (active, load, file string) {
	t.Helper()
	p, err := c.SystemctlShow(context.Background(), unit, "ActiveState", "LoadState", "UnitFileState")
	if err != nil {
		t.Fatal(err)
	}
	return p["ActiveState"], p["LoadState"], p["UnitFileState"]
}

func assertHalted(t *testing.T, c *sysbox.Container) {
	t.Helper()
	ctx := context.Background()
	for _, u := range units {
		active, load, file := state(t, c, u)
		if active != "inactive" || load != "masked" || file != "masked-runtime" {
			t.Errorf("%s: ActiveState=%s LoadState=%s UnitFileState=%s, want inactive, masked, masked-runtime", u, active, load, file)
		}
		if out, err := c.Exec(ctx, "readlink", "/run/systemd/system/"+u); err != nil || strings.TrimSpace(string(out)) != "/dev/null" {
			t.Errorf("runtime mask of %s: %q %v", u, out, err)
		}
		if _, err := c.Exec(ctx, "test", "!", "-e", "/etc/systemd/system/"+u); err != nil {
			t.Errorf("%s masked persistently: %v", u, err)
		}
	}
}

func assertRunning(t *testing.T, c *sysbox.Container) {
	t.Helper()
	for _, u := range units {
		active, load, file := state(t, c, u)
		if active != "active" || load != "loaded" || file != "enabled" {
			t.Errorf("%s: ActiveState=%s LoadState=%s UnitFileState=%s, want active, loaded, enabled", u, active, load, file)
		}
	}
}

func haltedReason(t *testing.T, c *sysbox.Container) string {
	t.Helper()
	b, err := c.ReadFile(context.Background(), "/run/pve-inspectd/halted")
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Reason string }
	if err := jsonUnmarshal(b, &st); err != nil {
		t.Fatalf("state file %q: %v", b, err)
	}
	return st.Reason
}

// TestHaltRecoverReboot is the acceptance path: the halt, run by a hardened
// unit, leaves the API daemons inactive and runtime-masked; recover refuses
// while the cause persists and brings them back once it is gone; a reboot
// clears the mask.
func TestHaltRecoverReboot(t *testing.T) {
	c := boot(t)
	ctx := context.Background()
	assertRunning(t, c)

	if out, err := c.Exec(ctx, "systemctl", "start", "pve-inspectd-halt@auto.service"); err != nil {
		t.Fatalf("halt unit failed: %v\n%s", err, journal(c, "pve-inspectd-halt@auto.service"))
	} else if len(out) > 0 {
		t.Logf("systemctl: %s", out)
	}
	assertHalted(t, c)
	const reason = "test: lockdown not enforceable (auto)"
	if got := haltedReason(t, c); got != reason {
		t.Errorf("state file reason %q, want %q", got, reason)
	}
	if j := journal(c, "pve-inspectd-halt@auto.service"); !strings.Contains(j, "fail-deadly halt") || !strings.Contains(j, reason) {
		t.Errorf("journal of the halt unit lacks the halt record:\n%s", j)
	}

	// Idempotent: a second halt (here from a root shell) keeps the first reason.
	if _, err := c.Exec(ctx, "pve-inspectd", "-c", "/etc/pve-inspectd/auto.toml", "halt", "--reason", "second"); err != nil {
		t.Fatal(err)
	}
	assertHalted(t, c)
	if got := haltedReason(t, c); got != reason {
		t.Errorf("after a second halt the reason is %q, want the first one", got)
	}

	// The cause persists: marker present, and the container's network
	// namespace has no default route.
	if err := c.WriteFile(ctx, marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := c.Exec(ctx, "pve-inspectd", "recover")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "no default route") {
		t.Fatalf("recover with the cause present: err=%v out=%q, want exit 3 naming the cause", err, out)
	}
	assertHalted(t, c)
	if haltedReason(t, c) != reason {
		t.Error("refused recover touched the state file")
	}

	// Fix the cause: give the container a default route.
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
	// With a default route back, the lockdown still has to be proven in
	// force: that is the daemon's word. Run it and wait until it says so.
	if out, err := c.Exec(ctx, "systemd-run", "--unit=pve-inspectd-proof", "--collect", "pve-inspectd", "run"); err != nil {
		t.Fatalf("start the daemon: %v %s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.Exec(ctx, "pve-inspectd", "lockdown", "status")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never proved the lockdown: %v %s\n%s", err, out, journal(c, "pve-inspectd-proof.service"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := c.Exec(ctx, "pve-inspectd", "recover"); err != nil {
		t.Fatalf("recover after the fix: %v", err)
	} else if !strings.Contains(string(out), "recovered") {
		t.Errorf("recover said %q", out)
	}
	assertRunning(t, c)
	if got := haltedReason(t, c); got != "" {
		t.Errorf("state file still there after recover (reason %q)", got)
	}
	if out, err := c.Exec(ctx, "pve-inspectd", "recover"); err != nil || !strings.Contains(string(out), "not halted") {
		t.Errorf("second recover: %q %v", out, err)
	}

	// Halt again, then reboot: the runtime mask and the state file go with /run.
	if _, err := c.Exec(ctx, "systemctl", "start", "pve-inspectd-halt@private.service"); err != nil {
		t.Fatalf("halt unit failed: %v\n%s", err, journal(c, "pve-inspectd-halt@private.service"))
	}
	assertHalted(t, c)
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	assertRunning(t, c)
	if got := haltedReason(t, c); got != "" {
		t.Errorf("state file survived the reboot (reason %q)", got)
	}

	// A configuration that cannot be read does not stop the halt: it runs
	// with the defaults and then reports the error.
	if err := c.WriteFile(ctx, "/etc/pve-inspectd/broken.toml", []byte("[halt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Exec(ctx, "pve-inspectd", "-c", "/etc/pve-inspectd/broken.toml", "halt", "--reason", "broken config"); err == nil {
		t.Errorf("halt with a broken config exited 0: %s", out)
	}
	assertHalted(t, c)
	if got := haltedReason(t, c); got != "broken config" {
		t.Errorf("state file reason %q", got)
	}
}

// TestHaltTransports checks which way to systemd works for the halt unit
// (root, CapabilityBoundingSet=CAP_NET_ADMIN CAP_KILL, NoNewPrivileges):
// the private socket and the system bus both do while dbus runs; with the
// bus down only the private socket does; as an unprivileged user neither.
func TestHaltTransports(t *testing.T) {
	c := boot(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		unit    string
		dbusUp  bool
		wantOK  bool
		wantErr string // in the unit's journal when it fails
	}{
		{"private, bounded caps", "pve-inspectd-halt@private.service", true, true, ""},
		{"system bus, bounded caps", "pve-inspectd-halt@system.service", true, true, ""},
		{"auto, bounded caps", "pve-inspectd-halt@auto.service", true, true, ""},
		{"private as nobody", "pve-inspectd-halt-nobody@private.service", true, false, "permission denied"},
		{"system bus as nobody", "pve-inspectd-halt-nobody@system.service", true, false, "halt: runtime-mask"},
		{"private, dbus down", "pve-inspectd-halt@private.service", false, true, ""},
		{"auto, dbus down", "pve-inspectd-halt@auto.service", false, true, ""},
		{"system bus, dbus down", "pve-inspectd-halt@system.service", false, false, "system bus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dbus := "start"
			if !tt.dbusUp {
				dbus = "stop"
			}
			if _, err := c.Exec(ctx, "systemctl", dbus, "dbus.socket", "dbus.service"); err != nil {
				t.Fatal(err)
			}
			assertRunning(t, c)
			_, err := c.Exec(ctx, "systemctl", "start", tt.unit)
			j := journal(c, tt.unit)
			if tt.wantOK {
				if err != nil {
					t.Fatalf("halt failed: %v\n%s", err, j)
				}
				assertHalted(t, c)
				if out, err := c.Exec(ctx, "pve-inspectd", "recover"); err != nil {
					t.Fatalf("recover: %v %s\npveproxy journal:\n%s", err, out, journal(c, "pveproxy.service"))
				}
				return
			}
			if err == nil {
				t.Fatalf("halt succeeded, want a refusal:\n%s", j)
			}
			if !strings.Contains(j, tt.wantErr) {
				t.Errorf("journal lacks %q:\n%s", tt.wantErr, j)
			}
			t.Logf("refused as expected:\n%s", errorLines(j))
			assertRunning(t, c) // nothing was stopped or masked
			if _, err := c.Exec(ctx, "rm", "-f", "/run/pve-inspectd/halted"); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, "systemctl", "reset-failed", tt.unit); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := c.Exec(ctx, "systemctl", "start", "dbus.socket", "dbus.service"); err != nil {
		t.Fatal(err)
	}
}

func journal(c *sysbox.Container, unit string) string {
	out, err := c.Exec(context.Background(), "journalctl", "--no-pager", "-o", "cat", "-u", unit)
	if err != nil {
		return fmt.Sprintf("(journalctl: %v)", err)
	}
	return string(out)
}

// errorLines returns the journal lines that carry an error.
func errorLines(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "error=") || strings.Contains(l, "pve-inspectd:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
