package deb

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/nsrun"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// Versions of the two packages the tests build: the second upgrades the
// first.
const (
	version1 = "0.0.1~pkgtest1-1"
	version2 = "0.0.1~pkgtest2-1"
)

// exposureMax is the highest `systemd-analyze security` exposure score the
// daemon's unit may have (0 = locked down, 10 = unprotected). Measured in
// the container (systemd 252): see the package README.
const exposureMax = 3.0

// haltExposureMax is the same for the halt unit (no capabilities, no
// network).
const haltExposureMax = 1.2

// suite is the Debian release of the container: Proxmox VE 9's base
// (systemd 257, whose OnFailure= semantics differ from bookworm's 252).
const suite = "trixie"

// rootfsPackages are what the package needs in the container on top of
// minbase+systemd: its dependencies (init-system-helpers, nftables),
// iptables for the reference scripts' rules, iproute2 for a default route.
var rootfsPackages = []string{"init-system-helpers", "iproute2", "iptables", "nftables"}

// build holds the packages built once per test binary.
var build struct {
	once     sync.Once
	dir      string
	v1, v2   string
	err      error
	buildLog []byte
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pve-inspectd-deb-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build.dir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot is the module's root (this package is packaging/deb).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root: %v", err)
	}
	return root
}

// debs builds the two packages with `make deb` (once per test binary) and
// returns their paths.
func debs(t *testing.T) (v1, v2 string) {
	t.Helper()
	testkit.RequireTools(t, "make", "gzip", "git")
	root := repoRoot(t)
	build.once.Do(func() {
		bin := filepath.Join(build.dir, "bin")
		for _, v := range []string{version1, version2} {
			dist := filepath.Join(build.dir, "dist-"+v)
			cmd := exec.Command("make", "-C", root, "deb", "BIN="+bin, "DIST="+dist, "DEB_VERSION="+v)
			out, err := cmd.CombinedOutput()
			build.buildLog = append(build.buildLog, out...)
			if err != nil {
				build.err = fmt.Errorf("make deb %s: %w", v, err)
				return
			}
		}
		build.v1 = filepath.Join(build.dir, "dist-"+version1, "pve-inspectd_"+version1+"_amd64.deb")
		build.v2 = filepath.Join(build.dir, "dist-"+version2, "pve-inspectd_"+version2+"_amd64.deb")
	})
	if build.err != nil {
		t.Fatalf("%v\n%s", build.err, build.buildLog)
	}
	return build.v1, build.v2
}

// TestLintian: lintian reports no error or warning except the documented
// overrides, every override has a one-line reason above it, and no
// override is stale.
func TestLintian(t *testing.T) {
	testkit.RequireTools(t, "lintian")
	v1, _ := debs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "lintian", "--pedantic", "--display-info", "--show-overrides", "--fail-on", "none", v1).CombinedOutput()
	t.Logf("lintian:\n%s", out)
	if err != nil {
		t.Fatalf("lintian: %v", err)
	}
	// Tags are judged here: --fail-on would count overridden ones too.
	overridden := 0
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "E: "), strings.HasPrefix(line, "W: "):
			t.Errorf("lintian: %s", line)
		case strings.Contains(line, "unused-override"), strings.Contains(line, "mismatched-override"):
			t.Errorf("stale override: %s", line)
		case strings.HasPrefix(line, "O: "):
			overridden++
		}
	}
	ov, err := os.ReadFile("lintian-overrides")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(ov)), "\n")
	n := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
			continue
		}
		n++
		if i == 0 || !strings.HasPrefix(lines[i-1], "# ") || len(strings.TrimSpace(lines[i-1])) < 10 {
			t.Errorf("override %q has no one-line reason above it", l)
		}
	}
	if overridden != n {
		t.Errorf("lintian used %d overrides, the file has %d", overridden, n)
	}
}

// box is a booted container with helpers for the tests.
type box struct {
	*sysbox.Container
	t   *testing.T
	ctx context.Context
}

// boot starts a container (root only) and removes it when the test ends.
func boot(t *testing.T, o sysbox.Options) *box {
	t.Helper()
	testkit.RequireRoot(t, "debootstrap", "nsenter")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	o.Rootfs.Packages = append(o.Rootfs.Packages, rootfsPackages...)
	o.Rootfs.Suite = suite
	c, err := sysbox.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.Exec(context.Background(), "journalctl", "--no-pager", "-n", "150", "-u", "pve-inspectd.service", "-u", "pve-inspectd-halt.service")
			t.Logf("journal:\n%s", out)
		}
		if err := c.Close(); err != nil {
			t.Errorf("close container: %v", err)
		}
	})
	return &box{Container: c, t: t, ctx: ctx}
}

// run executes argv in the container and fails the test on error.
func (b *box) run(argv ...string) string {
	b.t.Helper()
	out, err := b.Exec(b.ctx, argv...)
	if err != nil {
		b.t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// sh runs a shell script in the container and fails the test on error.
func (b *box) sh(script string) string {
	b.t.Helper()
	return b.run("/bin/sh", "-c", script)
}

// install copies a .deb in and runs dpkg -i.
func (b *box) install(deb string) string {
	b.t.Helper()
	dst := "/root/" + filepath.Base(deb)
	if err := b.CopyIn(b.ctx, deb, dst); err != nil {
		b.t.Fatal(err)
	}
	return b.run("dpkg", "-i", dst)
}

// show returns systemctl show properties of a unit.
func (b *box) show(unit string, props ...string) map[string]string {
	b.t.Helper()
	p, err := b.SystemctlShow(b.ctx, unit, props...)
	if err != nil {
		b.t.Fatal(err)
	}
	return p
}

// tablePresent reports whether table inet pve-inspect exists.
func (b *box) tablePresent() bool {
	b.t.Helper()
	return strings.Contains(b.run("nft", "list", "tables"), "table inet pve-inspect")
}

// eventually polls cond every 200 ms until it holds or timeout passes.
func (b *box) eventually(timeout time.Duration, what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// addUplink gives the container a management interface with the default
// route (a veth pair inside the container's own network namespace), which
// the lockdown needs to be enforced rather than fail closed.
func (b *box) addUplink() {
	b.t.Helper()
	b.sh(`set -e
ip link add mgmt0 type veth peer name mgmt0p
ip link set mgmt0p up
ip link set mgmt0 up
ip addr add 192.0.2.2/24 dev mgmt0
ip route add default via 192.0.2.1 dev mgmt0`)
}

// requireLockdownInForce: the daemon reports the lockdown enforced and the
// guard's status shows it on, with mgmt0 as the management interface.
func (b *box) requireLockdownInForce() {
	b.t.Helper()
	b.eventually(60*time.Second, "the lockdown in force", func() bool {
		_, err := b.Exec(b.ctx, "pve-inspectd", "lockdown", "status")
		return err == nil
	})
	out := b.run("pve-inspectd", "lockdown", "status", "--json")
	if !strings.Contains(out, `"enforced": true`) {
		b.t.Fatalf("lockdown status:\n%s", out)
	}
	st := b.run("pve-inspectd", "status")
	if !strings.Contains(st, "lockdown: on") || !strings.Contains(st, "management (default route): mgmt0") {
		b.t.Fatalf("guard status:\n%s", st)
	}
}

// requireGuardInForce: the service is active and `pve-inspectd status`
// finds the table as desired (exit 0).
func (b *box) requireGuardInForce() {
	b.t.Helper()
	if st := b.show("pve-inspectd.service", "ActiveState", "SubState")["ActiveState"]; st != "active" {
		b.t.Fatalf("pve-inspectd.service is %s", st)
	}
	out := b.run("pve-inspectd", "status")
	if !strings.Contains(out, "in force as desired") {
		b.t.Fatalf("status:\n%s", out)
	}
}

// TestInstallUpgradeRemovePurge walks the package's life in one container:
// install (guard in force under the hardened unit), watchdog, upgrade with
// an edited conffile (the table present throughout), remove, purge.
func TestInstallUpgradeRemovePurge(t *testing.T) {
	v1, v2 := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-life"})

	// The guard turns IPv6 off for new interfaces and puts the old value
	// back when the package is removed.
	const v6 = "/proc/sys/net/ipv6/conf/default/disable_ipv6"
	b.sh("echo 0 > " + v6)
	out := b.install(v1)
	t.Logf("dpkg -i:\n%s", out)
	if !strings.Contains(out, "Proxmox VE is not installed") {
		t.Errorf("postinst did not say it skipped the Proxmox API token:\n%s", out)
	}
	p := b.show("pve-inspectd.service", "UnitFileState")
	if p["UnitFileState"] != "enabled" {
		t.Fatalf("not enabled: %v", p)
	}
	b.requireGuardInForce()

	t.Run("hardening", func(t *testing.T) { checkHardening(t, b) })
	t.Run("watchdog", func(t *testing.T) { checkWatchdog(t, b) })
	if t.Failed() {
		return
	}

	// Upgrade: the operator's edit of the conffile survives, and the table
	// is in the kernel at every sample taken while dpkg runs.
	edited := strings.Replace(b.run("cat", "/etc/pve-inspectd/config.toml"), `# verify_interval = "30s"`, `verify_interval = "11s"`, 1)
	if !strings.Contains(edited, `verify_interval = "11s"`) {
		t.Fatal("conffile has no verify_interval line to edit")
	}
	if err := b.WriteFile(b.ctx, "/etc/pve-inspectd/config.toml", []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("systemctl", "restart", "pve-inspectd.service")
	b.requireGuardInForce()
	pidBefore := b.show("pve-inspectd.service", "MainPID")["MainPID"]

	samples := startSampler(t, b)
	out = b.install(v2)
	t.Logf("dpkg -i (upgrade):\n%s", out)
	b.requireGuardInForce()
	ok, missing := samples.stop()
	t.Logf("table samples during the upgrade: %d present, %d missing", ok, missing)
	if missing > 0 || ok < 5 {
		t.Fatalf("table inet pve-inspect missing in %d of %d samples during the upgrade", missing, ok+missing)
	}
	if got := b.run("dpkg-query", "-W", "-f", "${Version}", "pve-inspectd"); got != version2 {
		t.Fatalf("installed version %q, want %q", got, version2)
	}
	if pid := b.show("pve-inspectd.service", "MainPID")["MainPID"]; pid == pidBefore {
		t.Fatalf("daemon not restarted by the upgrade (MainPID %s)", pid)
	}
	if got := b.run("cat", "/etc/pve-inspectd/config.toml"); got != edited {
		t.Fatalf("the operator's conffile was not kept:\n%s", got)
	}

	// Remove: the service and the table go, the configuration stays.
	out = b.run("dpkg", "-r", "pve-inspectd")
	t.Logf("dpkg -r:\n%s", out)
	p = b.show("pve-inspectd.service", "ActiveState", "LoadState")
	if p["ActiveState"] != "inactive" || p["LoadState"] == "loaded" {
		t.Fatalf("after remove: %v", p)
	}
	if b.tablePresent() {
		t.Fatal("table inet pve-inspect still present after remove")
	}
	if _, err := b.Exec(b.ctx, "test", "-e", "/usr/bin/pve-inspectd"); err == nil {
		t.Fatal("binary still present after remove")
	}
	if v := strings.TrimSpace(b.run("cat", v6)); v != "0" {
		t.Errorf("disable_ipv6=%s after remove, want the value from before the install (0)", v)
	}
	b.run("test", "-f", "/etc/pve-inspectd/config.toml")

	// Purge: the configuration and state go too.
	out = b.run("dpkg", "-P", "pve-inspectd")
	t.Logf("dpkg -P:\n%s", out)
	for _, p := range []string{"/etc/pve-inspectd", "/var/lib/pve-inspectd", "/run/pve-inspectd", "/etc/sysctl.d/90-pve-inspectd.conf"} {
		if _, err := b.Exec(b.ctx, "test", "-e", p); err == nil {
			t.Errorf("%s still present after purge", p)
		}
	}
	if _, err := b.Exec(b.ctx, "dpkg-query", "-W", "pve-inspectd"); err == nil {
		t.Error("dpkg still knows the package after purge")
	}
}

// checkHardening: systemctl show reports the unit's sandboxing, the running
// daemon carries it (bounding set, no_new_privs, seccomp), and the
// exposure score stays below exposureMax.
func checkHardening(t *testing.T, b *box) {
	b = &box{Container: b.Container, t: t, ctx: b.ctx}
	// systemd parsed both units without complaint (unknown keys, bad
	// values and stray lines are logged as "<unit>:<line>: ...").
	if out := b.run("journalctl", "--no-pager", "-o", "cat"); regexp.MustCompile(`pve-inspectd(-halt)?\.service:\d+:`).MatchString(out) {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "pve-inspectd") && regexp.MustCompile(`\.service:\d+:`).MatchString(l) {
				t.Errorf("unit file: %s", l)
			}
		}
	}
	want := map[string]string{
		"Type":                    "notify",
		"NotifyAccess":            "main",
		"Restart":                 "always",
		"WatchdogUSec":            "20s",
		"OnFailure":               "pve-inspectd-halt.service",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"ProtectKernelModules":    "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectControlGroups":    "yes",
		"RestrictNamespaces":      "yes",
		"RestrictSUIDSGID":        "yes",
		"MemoryDenyWriteExecute":  "yes",
		"LockPersonality":         "yes",
		"CapabilityBoundingSet":   "cap_chown cap_kill cap_net_admin",
		"AmbientCapabilities":     "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_NETLINK AF_UNIX",
		"SystemCallArchitectures": "native",
		"MemoryHigh":              "1073741824",
		"MemoryMax":               "2147483648",
	}
	var props []string
	for k := range want {
		props = append(props, k)
	}
	got := b.show("pve-inspectd.service", append(props, "MainPID", "SystemCallFilter", "Before")...)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if !strings.Contains(got["Before"], "pve-guests.service") {
		t.Errorf("Before=%q lacks pve-guests.service", got["Before"])
	}
	// The filter is an allow-list (@system-service minus @privileged and
	// @resources): no mount, no reboot, no module loading.
	for _, sc := range []string{"mount", "reboot", "init_module", "setuid"} {
		if regexp.MustCompile(`\b` + sc + `\b`).MatchString(got["SystemCallFilter"]) {
			t.Errorf("SystemCallFilter allows %s", sc)
		}
	}
	if !strings.Contains(got["SystemCallFilter"], "sendmsg") {
		t.Errorf("SystemCallFilter=%q is not an allow-list with sendmsg", got["SystemCallFilter"])
	}

	// The running daemon, as the kernel sees it.
	status := b.run("cat", "/proc/"+got["MainPID"]+"/status")
	fields := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	// CAP_CHOWN (0), CAP_KILL (5) and CAP_NET_ADMIN (12).
	if fields["CapBnd"] != fmt.Sprintf("%016x", 1<<0|1<<5|1<<12) {
		t.Errorf("daemon CapBnd=%s, want only CAP_CHOWN, CAP_KILL and CAP_NET_ADMIN", fields["CapBnd"])
	}
	if fields["NoNewPrivs"] != "1" || fields["Seccomp"] != "2" {
		t.Errorf("daemon NoNewPrivs=%s Seccomp=%s, want 1 and 2", fields["NoNewPrivs"], fields["Seccomp"])
	}

	// The guard's sysctl went through the hardening.
	if v := strings.TrimSpace(b.run("cat", "/proc/sys/net/ipv6/conf/default/disable_ipv6")); v != "1" {
		t.Errorf("net.ipv6.conf.default.disable_ipv6=%s after start, want 1", v)
	}

	score := exposure(t, b, "pve-inspectd.service")
	t.Logf("systemd-analyze security pve-inspectd.service: exposure %.1f (max %.1f)", score, exposureMax)
	if score > exposureMax {
		t.Errorf("exposure %.1f above %.1f", score, exposureMax)
	}
	hs := exposure(t, b, "pve-inspectd-halt.service")
	t.Logf("systemd-analyze security pve-inspectd-halt.service: exposure %.1f (max %.1f)", hs, haltExposureMax)
	if hs > haltExposureMax {
		t.Errorf("halt unit exposure %.1f above %.1f", hs, haltExposureMax)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for [a-z-]+\.service: ([0-9.]+)`)

// exposure runs systemd-analyze security on the unit and returns its score.
func exposure(t *testing.T, b *box, unit string) float64 {
	t.Helper()
	out, _ := b.Exec(b.ctx, "systemd-analyze", "security", "--no-pager", unit)
	m := exposureRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure score in:\n%s", out)
	}
	f, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	if testing.Verbose() {
		t.Logf("systemd-analyze security:\n%s", out)
	}
	return f
}

// checkWatchdog freezes the daemon with SIGSTOP: it stops pinging, systemd
// aborts it after WatchdogSec and starts a new one, and the table stays in
// the kernel meanwhile (orphaned, then re-adopted).
func checkWatchdog(t *testing.T, b *box) {
	b = &box{Container: b.Container, t: t, ctx: b.ctx}
	before := b.show("pve-inspectd.service", "MainPID", "NRestarts")
	b.sh("kill -STOP " + before["MainPID"])
	b.eventually(90*time.Second, "the watchdog to restart the frozen daemon", func() bool {
		p := b.show("pve-inspectd.service", "MainPID", "NRestarts", "ActiveState")
		return p["ActiveState"] == "active" && p["MainPID"] != before["MainPID"] && p["MainPID"] != "0" && p["NRestarts"] != before["NRestarts"]
	})
	after := b.show("pve-inspectd.service", "NRestarts")
	nb, _ := strconv.Atoi(before["NRestarts"])
	na, _ := strconv.Atoi(after["NRestarts"])
	if na <= nb {
		t.Fatalf("NRestarts %d -> %d", nb, na)
	}
	out := b.run("journalctl", "--no-pager", "-u", "pve-inspectd.service")
	if !strings.Contains(out, "Watchdog timeout") {
		t.Errorf("journal does not show a watchdog timeout:\n%s", out)
	}
	b.requireGuardInForce()
}

// sampler lists the tables in a loop inside the container until stopped.
type sampler struct {
	b    *box
	done chan error
}

const sampleScript = `rm -f /root/samples /root/stop-sampling
while [ ! -e /root/stop-sampling ]; do
	if nft list tables 2>&1 | grep -q '^table inet pve-inspect$'; then echo ok; else echo MISSING; fi >> /root/samples
	sleep 0.05
done`

func startSampler(t *testing.T, b *box) *sampler {
	s := &sampler{b: b, done: make(chan error, 1)}
	go func() {
		_, err := b.Exec(b.ctx, "/bin/sh", "-c", sampleScript)
		s.done <- err
	}()
	// Wait for the first sample so the loop surely runs before dpkg.
	b.eventually(2*time.Minute, "the first table sample", func() bool {
		out, _ := b.Exec(b.ctx, "cat", "/root/samples")
		return len(out) > 0
	})
	return s
}

// stop ends the loop and counts the samples.
func (s *sampler) stop() (ok, missing int) {
	s.b.t.Helper()
	s.b.run("touch", "/root/stop-sampling")
	if err := <-s.done; err != nil {
		s.b.t.Fatalf("sampler: %v", err)
	}
	out := s.b.run("cat", "/root/samples")
	ok = strings.Count(out, "ok\n")
	missing = strings.Count(out, "MISSING\n")
	return ok, missing
}

// Stand-ins for the reference scripts' units: the names they install and
// the rules they add (see lockdown/legacy), on the loopback interface (the
// container's only one).
var referenceUnits = map[string]string{
	"inspect-proxmox-block-cloud-metadata.service": `[Unit]
Description=reference stand-in: block cloud metadata
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/iptables -w -t raw -I PREROUTING 1 -d 169.254.0.0/16 -j DROP
ExecStart=/usr/sbin/iptables -w -I FORWARD 1 -s 169.254.0.0/16 -j DROP
ExecStart=/usr/sbin/ip6tables -w -A FORWARD -j DROP
[Install]
WantedBy=multi-user.target
`,
	"inspect-proxmox-egress-lockdown.service": `[Unit]
Description=reference stand-in: egress lockdown
ConditionPathExists=/etc/inspect-proxmox-egress-lockdown
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/inspect-proxmox-egress-lockdown.sh
ExecStart=/usr/sbin/iptables -w -t mangle -I FORWARD 1 -o lo -m comment --comment "inspect-proxmox-egress-lockdown 1.2" -j DROP
ExecStart=/usr/sbin/iptables -w -t mangle -I OUTPUT 1 -o lo -m owner --uid-owner 65534 -m comment --comment "inspect-proxmox-egress-lockdown 1.2" -j DROP
[Install]
WantedBy=multi-user.target
`,
	"inspect-proxmox-egress-lockdown.timer": `[Unit]
Description=reference stand-in: egress lockdown re-assert
[Timer]
OnUnitActiveSec=1h
[Install]
WantedBy=timers.target
`,
	"inspect-proxmox-egress-lockdown-halt.service": `[Unit]
Description=reference stand-in: egress lockdown halt
[Service]
Type=oneshot
ExecStart=/bin/true
`,
}

// referenceScript stands in for the reference lockdown script: it leaves a
// trace when it runs.
const referenceScript = "#!/bin/sh\necho ran >> /root/old-script-ran\n"

// TestMigrateFromReference: on a node set up by the reference scripts
// (their units enabled, their rules in force, the marker present), the
// install disables their units, removes their rules (an operator's rule
// stays), and keeps the marker; the guard is in force; and removing the
// package is refused while the marker is present.
func TestMigrateFromReference(t *testing.T) {
	v1, _ := debs(t)
	marker := "# lockdown asked for by the operator\n"
	b := boot(t, sysbox.Options{
		Name:   "pkg-migrate",
		Units:  referenceUnits,
		Enable: []string{"inspect-proxmox-block-cloud-metadata.service", "inspect-proxmox-egress-lockdown.service", "inspect-proxmox-egress-lockdown.timer"},
		Files: []sysbox.File{{Path: "/etc/inspect-proxmox-egress-lockdown", Data: []byte(marker)},
			{Path: "/usr/local/bin/inspect-proxmox-egress-lockdown.sh", Data: []byte(referenceScript), Mode: 0o755}},
	})
	b.addUplink()
	b.run("iptables", "-w", "-t", "mangle", "-I", "FORWARD", "1", "-i", "lo", "-m", "comment", "--comment", "operator rule", "-j", "DROP")
	before := b.run("iptables-save") + b.run("ip6tables-save")
	for _, rule := range []string{"inspect-proxmox-egress-lockdown 1.2", "-d 169.254.0.0/16", "-s 169.254.0.0/16", "-A FORWARD -j DROP"} {
		if !strings.Contains(before, rule) {
			t.Fatalf("reference stand-ins did not install %q:\n%s", rule, before)
		}
	}

	out := b.install(v1)
	t.Logf("dpkg -i:\n%s", out)
	for u := range referenceUnits {
		p := b.show(u, "UnitFileState", "ActiveState")
		if p["ActiveState"] == "active" || p["UnitFileState"] == "enabled" {
			t.Errorf("%s after install: %v", u, p)
		}
	}
	after := b.run("iptables-save") + b.run("ip6tables-save")
	if strings.Contains(after, "inspect-proxmox") || strings.Contains(after, "169.254.0.0/16") || strings.Contains(after, "-A FORWARD -j DROP") {
		t.Errorf("reference rules left after install:\n%s", after)
	}
	if !strings.Contains(after, "operator rule") {
		t.Errorf("the operator's rule was removed:\n%s", after)
	}
	if got := b.run("cat", "/etc/inspect-proxmox-egress-lockdown"); got != marker {
		t.Errorf("marker changed: %q", got)
	}
	b.requireGuardInForce()
	// The lockdown is in force under the daemon's hardening: the guard's
	// lockdown set holds mgmt0, and the SDN resolver file (created, as no
	// dnsmasq made /run/dnsmasq here) is blanked.
	b.requireLockdownInForce()
	if got := b.run("cat", "/run/dnsmasq/resolv.conf"); strings.Contains(got, "nameserver") || !strings.HasPrefix(got, "#") {
		t.Errorf("resolver not blanked: %q", got)
	}
	if p := b.show("pveproxy.service", "ActiveState"); p["ActiveState"] != "active" {
		t.Errorf("the node halted although the lockdown is in force: pveproxy %v", p)
	}
	checkRunbook(t, b)

	// Upgrade with the lockdown on: the lockdown set never loses the
	// management interface (nft monitor sees every element deletion).
	b.run("systemd-run", "--unit=nft-monitor", "-p", "StandardOutput=file:/root/nft-monitor", "/usr/sbin/nft", "monitor")
	b.eventually(2*time.Minute, "nft monitor", func() bool {
		return b.show("nft-monitor.service", "ActiveState")["ActiveState"] == "active"
	})
	_, v2 := debs(t)
	b.install(v2)
	b.requireLockdownInForce()
	b.run("systemctl", "stop", "nft-monitor.service")
	mon := b.run("cat", "/root/nft-monitor")
	t.Logf("nft monitor during the upgrade:\n%s", mon)
	for _, l := range strings.Split(mon, "\n") {
		if strings.Contains(l, "delete") && (strings.Contains(l, "pve-inspect lockdown") || strings.Contains(l, "table inet pve-inspect")) {
			t.Errorf("lockdown lifted during the upgrade: %s", l)
		}
	}

	// The marker guards the node: removing the package is refused.
	if out, err := b.Exec(b.ctx, "dpkg", "-r", "pve-inspectd"); err == nil {
		t.Fatalf("dpkg -r succeeded with the lockdown marker present:\n%s", out)
	} else if !strings.Contains(string(out), "marker") {
		t.Fatalf("dpkg -r failed without naming the marker: %v\n%s", err, out)
	}
	b.requireGuardInForce()
}

// TestHaltOnRepeatedFailure: with the lockdown marker present, one crash of
// the daemon is restarted without a halt; a daemon that keeps failing hits
// the start limit, and the OnFailure unit halts the Proxmox API (the
// stand-in pveproxy and pvedaemon stopped and runtime-masked) from under
// its own hardening.
func TestHaltOnRepeatedFailure(t *testing.T) {
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{
		Name:  "pkg-halt",
		Files: []sysbox.File{{Path: "/etc/inspect-proxmox-egress-lockdown", Data: []byte("\n")}},
	})
	b.addUplink()
	b.install(v1)
	b.requireGuardInForce()
	b.requireLockdownInForce()

	// One crash: restarted, no halt.
	before := b.show("pve-inspectd.service", "MainPID", "NRestarts")
	b.sh("kill -KILL " + before["MainPID"])
	b.eventually(60*time.Second, "the daemon to be restarted after one crash", func() bool {
		p := b.show("pve-inspectd.service", "MainPID", "NRestarts", "ActiveState")
		return p["ActiveState"] == "active" && p["MainPID"] != before["MainPID"] && p["MainPID"] != "0" && p["NRestarts"] != before["NRestarts"]
	})
	b.requireGuardInForce()
	if p := b.show("pveproxy.service", "ActiveState"); p["ActiveState"] != "active" {
		t.Fatalf("one crash halted the node: pveproxy %v", p)
	}
	if _, err := b.Exec(b.ctx, "test", "-e", "/run/pve-inspectd/halted"); err == nil {
		t.Fatal("one crash left a halt state file")
	}
	if out := b.run("journalctl", "--no-pager", "-u", "pve-inspectd-halt.service"); strings.Contains(out, "Starting") {
		t.Fatalf("halt unit started after one crash:\n%s", out)
	}

	// Keeps failing: a configuration the daemon refuses.
	if err := b.WriteFile(b.ctx, "/etc/pve-inspectd/config.toml", []byte("[guard]\nverify_interval = \"1ms\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("systemctl", "restart", "--no-block", "pve-inspectd.service")
	// The halt stops the units one after another (pveproxy, then
	// pvedaemon): wait for the last (CI saw pvedaemon still active, masked,
	// when only pveproxy was awaited).
	b.eventually(3*time.Minute, "the start limit and the halt", func() bool {
		p := b.show("pve-inspectd.service", "ActiveState")
		q := b.show("pveproxy.service", "ActiveState", "UnitFileState")
		d := b.show("pvedaemon.service", "ActiveState", "UnitFileState")
		return p["ActiveState"] == "failed" && q["ActiveState"] == "inactive" && q["UnitFileState"] == "masked-runtime" &&
			d["ActiveState"] == "inactive" && d["UnitFileState"] == "masked-runtime"
	})
	for _, u := range []string{"pveproxy.service", "pvedaemon.service"} {
		if p := b.show(u, "ActiveState", "UnitFileState"); p["ActiveState"] != "inactive" || p["UnitFileState"] != "masked-runtime" {
			t.Errorf("%s after the halt: %v", u, p)
		}
	}
	if got := b.run("cat", "/run/pve-inspectd/halted"); !strings.Contains(got, "failed while the lockdown marker is present") {
		t.Errorf("halt state file: %q", got)
	}
	// The table outlives the failing daemon.
	if !b.tablePresent() {
		t.Error("table inet pve-inspect gone while the daemon keeps failing")
	}
}

// sandboxedAs returns the installed daemon unit with its ExecStart replaced
// by argv and made a oneshot: the same hardening, another program.
func sandboxedAs(unit, execStart string) (string, error) {
	var out []string
	replaced := false
	for _, l := range strings.Split(unit, "\n") {
		switch {
		case strings.HasPrefix(l, "ExecStart="):
			l = "ExecStart=" + execStart
			replaced = true
		case l == "Type=notify":
			l = "Type=oneshot"
		case strings.HasPrefix(l, "NotifyAccess="), strings.HasPrefix(l, "WatchdogSec="),
			strings.HasPrefix(l, "Restart"), strings.HasPrefix(l, "OnFailure="),
			strings.HasPrefix(l, "WantedBy="):
			continue
		}
		out = append(out, l)
	}
	if !replaced {
		return "", fmt.Errorf("no ExecStart in:\n%s", unit)
	}
	return strings.Join(out, "\n"), nil
}

// TestDaemonSandboxCanHalt: the daemon halts by itself when the lockdown
// cannot be proven; its hardening must allow that. `pve-inspectd halt`
// runs under the daemon unit's exact sandbox over each D-Bus transport
// (systemd's private socket, the system bus) and stops and runtime-masks
// the stand-in Proxmox API units.
func TestDaemonSandboxCanHalt(t *testing.T) {
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-sandbox-halt"})
	b.install(v1)
	b.requireGuardInForce()
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	for _, transport := range []string{"private", "system"} {
		t.Run(transport, func(t *testing.T) {
			b := &box{Container: b.Container, t: t, ctx: b.ctx}
			cfg := "/etc/pve-inspectd/halt-" + transport + ".toml"
			if err := b.WriteFile(b.ctx, cfg, []byte("[halt]\ntransport = \""+transport+"\"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			probe, err := sandboxedAs(unit, "/usr/bin/pve-inspectd -c "+cfg+" halt --reason sandbox-"+transport)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-haltprobe.service", []byte(probe), 0o644); err != nil {
				t.Fatal(err)
			}
			b.run("systemctl", "daemon-reload")
			if out, err := b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-haltprobe.service"); err != nil {
				j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-u", "pve-inspectd-haltprobe.service")
				t.Fatalf("halt under the daemon's sandbox: %v\n%s\n%s", err, out, j)
			}
			if p := b.show("pve-inspectd-haltprobe.service", "CapabilityBoundingSet", "NoNewPrivileges"); p["CapabilityBoundingSet"] != "cap_chown cap_kill cap_net_admin" || p["NoNewPrivileges"] != "yes" {
				t.Fatalf("probe unit not sandboxed like the daemon: %v", p)
			}
			for _, u := range []string{"pveproxy.service", "pvedaemon.service"} {
				if p := b.show(u, "ActiveState", "UnitFileState"); p["ActiveState"] != "inactive" || p["UnitFileState"] != "masked-runtime" {
					t.Errorf("%s after the halt: %v", u, p)
				}
			}
			if got := b.run("cat", "/run/pve-inspectd/halted"); !strings.Contains(got, "sandbox-"+transport) {
				t.Errorf("halt state file: %q", got)
			}
			// Undo for the next transport.
			b.run("systemctl", "unmask", "--runtime", "pveproxy.service", "pvedaemon.service")
			b.run("systemctl", "start", "pveproxy.service", "pvedaemon.service")
			b.run("rm", "-f", "/run/pve-inspectd/halted")
		})
	}
}

// TestDaemonSandboxCanSignalDnsmasq: the lockdown sends SIGHUP to the SDN
// dnsmasq, which runs as another user; under the daemon unit's sandbox that
// works (CAP_KILL), and without CAP_KILL it is refused, so the capability
// is needed and sufficient.
func TestDaemonSandboxCanSignalDnsmasq(t *testing.T) {
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-sandbox-kill"})
	b.install(v1)
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	for _, tc := range []struct {
		name     string
		dropKill bool
	}{{"with CAP_KILL", false}, {"without CAP_KILL", true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := &box{Container: b.Container, t: t, ctx: b.ctx}
			// A stand-in dnsmasq: a process of another user.
			b.run("systemd-run", "--unit=fake-dnsmasq", "--uid=65534", "--gid=65534", "/bin/sleep", "infinity")
			t.Cleanup(func() { _, _ = b.Exec(b.ctx, "systemctl", "stop", "fake-dnsmasq.service") })
			b.eventually(2*time.Minute, "the stand-in dnsmasq", func() bool {
				return b.show("fake-dnsmasq.service", "MainPID")["MainPID"] != "0"
			})
			pid := b.show("fake-dnsmasq.service", "MainPID")["MainPID"]
			probe, err := sandboxedAs(unit, "/bin/sh -c 'kill -HUP "+pid+"'")
			if err != nil {
				t.Fatal(err)
			}
			if tc.dropKill {
				probe = strings.Replace(probe, "CapabilityBoundingSet=CAP_NET_ADMIN CAP_KILL CAP_CHOWN", "CapabilityBoundingSet=CAP_NET_ADMIN CAP_CHOWN", 1)
			}
			if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-killprobe.service", []byte(probe), 0o644); err != nil {
				t.Fatal(err)
			}
			b.run("systemctl", "daemon-reload")
			_, err = b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-killprobe.service")
			j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-u", "pve-inspectd-killprobe.service")
			if tc.dropKill {
				if err == nil {
					t.Fatalf("SIGHUP to another user's process worked without CAP_KILL:\n%s", j)
				}
				if !strings.Contains(string(j), "not permitted") {
					t.Fatalf("refused, but not with EPERM:\n%s", j)
				}
				if st := b.show("fake-dnsmasq.service", "ActiveState")["ActiveState"]; st != "active" {
					t.Fatalf("stand-in dnsmasq %s after a refused signal", st)
				}
				return
			}
			if err != nil {
				t.Fatalf("SIGHUP under the daemon's sandbox: %v\n%s", err, j)
			}
			b.eventually(2*time.Minute, "the stand-in dnsmasq to get the SIGHUP", func() bool {
				return b.show("fake-dnsmasq.service", "ActiveState")["ActiveState"] != "active"
			})
		})
	}
}

// TestDaemonSandboxFilesystem: under the daemon unit's sandbox the
// sysctls the guard sets (the IPv6 default, the interfaces' ipv4 conf)
// and /run are writable; the rest of /proc/sys,
// /etc, /usr and /var (but its state directory) are not.
func TestDaemonSandboxFilesystem(t *testing.T) {
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-sandbox-fs"})
	b.install(v1)
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	// A Proxmox node's dir storage "local" (the unit's ReadWritePaths
	// needs it to exist when the unit starts).
	b.run("mkdir", "-p", "/var/lib/vz/images", "/var/lib/vz/dump")
	for _, tc := range []struct {
		path     string
		writable bool
	}{
		{"/proc/sys/net/ipv6/conf/default/disable_ipv6", true},
		{"/proc/sys/net/ipv4/conf/lo/rp_filter", true},
		{"/run/dnsmasq/resolv.conf", true},
		{"/var/lib/pve-inspectd/probe", true},
		{"/proc/sys/net/ipv4/ip_forward", false},
		{"/etc/pve-inspectd/config.toml", false},
		{"/usr/bin/pve-inspectd", false},
		{"/var/log/probe", false},
		{"/var/lib/vz/images/100/probe", true},
		{"/var/lib/vz/dump/probe", false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			b := &box{Container: b.Container, t: t, ctx: b.ctx}
			// Write the value already there (sysctls) or a new file.
			script := `v=$(cat "$0") && echo "$v" > "$0"`
			if !strings.HasPrefix(tc.path, "/proc/") {
				script = `mkdir -p "$(dirname "$0")" 2>/dev/null; : >> "$0"`
			}
			probe, err := sandboxedAs(unit, "/bin/sh -c '"+strings.ReplaceAll(script, "'", `'"'"'`)+"' "+tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-fsprobe.service", []byte(probe), 0o644); err != nil {
				t.Fatal(err)
			}
			b.run("systemctl", "daemon-reload")
			_, err = b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-fsprobe.service")
			if (err == nil) != tc.writable {
				j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "5", "-u", "pve-inspectd-fsprobe.service")
				t.Fatalf("write %s under the daemon's sandbox: err=%v, want writable=%v\n%s", tc.path, err, tc.writable, j)
			}
		})
	}
}

// TestDaemonSandboxTransferImage: the node's half of a disk transfer
// (diskxfer: write the blocks into the image Proxmox allocated, read them
// back) works under the daemon unit's sandbox for the dir storage "local"
// (/var/lib/vz/images), is refused for a dir storage elsewhere, and works
// there with the shipped drop-in (examples/transfer-storage.conf) for it.
func TestDaemonSandboxTransferImage(t *testing.T) {
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-sandbox-xfer"})
	b.install(v1)
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	example := b.run("cat", "/usr/share/doc/pve-inspectd/examples/transfer-storage.conf")
	const other = "/srv/pve-dir/images"
	if !strings.Contains(example, "#ReadWritePaths=-"+other) {
		t.Fatalf("the example drop-in has no ReadWritePaths line for %s:\n%s", other, example)
	}
	const dropin = "/etc/systemd/system/pve-inspectd-xferprobe.service.d/transfer-storage.conf"
	for _, tc := range []struct {
		name, image string
		dropin      bool
		ok          bool
	}{
		{"local", "/var/lib/vz/images/100/vm-100-pvei-probe.raw", false, true},
		{"other dir storage", other + "/100/vm-100-pvei-probe.raw", false, false},
		{"other dir storage with the drop-in", other + "/100/vm-100-pvei-probe.raw", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &box{Container: b.Container, t: t, ctx: b.ctx}
			// Proxmox (as root, outside the sandbox) allocates the image.
			b.run("sh", "-c", `mkdir -p "$(dirname "$0")" && rm -f "$0" && truncate -s 12M "$0"`, tc.image)
			b.run("rm", "-rf", filepath.Dir(dropin))
			if tc.dropin {
				conf := strings.Replace(example, "#ReadWritePaths=-"+other, "ReadWritePaths=-"+other, 1)
				b.run("mkdir", "-p", filepath.Dir(dropin))
				if err := b.WriteFile(b.ctx, dropin, []byte(conf), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			script := `dd if=/dev/urandom of=/tmp/src bs=1M count=8 status=none && dd if=/tmp/src of="$0" bs=4M conv=notrunc status=none && cmp -n 8388608 /tmp/src "$0"`
			probe, err := sandboxedAs(unit, "/bin/sh -c '"+script+"' "+tc.image)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-xferprobe.service", []byte(probe), 0o644); err != nil {
				t.Fatal(err)
			}
			b.run("systemctl", "daemon-reload")
			_, err = b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-xferprobe.service")
			if (err == nil) != tc.ok {
				j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "5", "-u", "pve-inspectd-xferprobe.service")
				t.Fatalf("transfer image %s under the daemon's sandbox: err=%v, want ok=%v\n%s", tc.image, err, tc.ok, j)
			}
		})
	}
}

// checkRunbook: after the takeover the reference units are masked (the
// lockdown service's name is the package's own unit now), the old script
// cannot run, and the reference runbook ("rm"/"touch" the marker, then
// "systemctl start inspect-proxmox-egress-lockdown.service") lifts and
// asks for the lockdown through the daemon. It leaves the marker present.
func checkRunbook(t *testing.T, b *box) {
	t.Helper()
	const own = "inspect-proxmox-egress-lockdown.service"
	for u := range referenceUnits {
		p := b.show(u, "LoadState", "FragmentPath")
		switch {
		case u == own && p["FragmentPath"] != "/usr/lib/systemd/system/"+own:
			t.Errorf("%s is not the package's unit: %v", u, p)
		case u != own && p["LoadState"] != "masked":
			t.Errorf("%s not masked after the takeover: %v", u, p)
		}
	}
	b.run("rm", "-f", "/root/old-script-ran")
	if out, err := b.Exec(b.ctx, "systemctl", "start", "inspect-proxmox-egress-lockdown.timer"); err == nil {
		t.Errorf("the reference timer started although masked:\n%s", out)
	}
	if out, err := b.Exec(b.ctx, "/usr/local/bin/inspect-proxmox-egress-lockdown.sh"); err == nil {
		t.Errorf("the reference script still runs:\n%s", out)
	}

	b.run("rm", "/etc/inspect-proxmox-egress-lockdown")
	b.run("systemctl", "start", own)
	if out := b.run("pve-inspectd", "lockdown", "status", "--json"); !strings.Contains(out, `"marker": false`) || !strings.Contains(out, `"ok": true`) {
		t.Errorf("runbook off: the unit succeeded but the lockdown is not lifted:\n%s", out)
	}
	b.run("touch", "/etc/inspect-proxmox-egress-lockdown")
	b.run("systemctl", "start", own)
	if out := b.run("pve-inspectd", "lockdown", "status", "--json"); !strings.Contains(out, `"enforced": true`) {
		t.Errorf("runbook on: the unit succeeded but the lockdown is not in force:\n%s", out)
	}
	b.requireLockdownInForce()
	if _, err := b.Exec(b.ctx, "test", "-e", "/root/old-script-ran"); err == nil {
		t.Errorf("the reference script ran after the takeover")
	}
	b.run("sh", "-c", "echo '# lockdown asked for by the operator' > /etc/inspect-proxmox-egress-lockdown")
}

// TestSocketGroup: with [api] socket_group set, the shipped unit's daemon
// hands the API socket and its runtime directory (RuntimeDirectoryMode=0750)
// to that group: a member reaches the API (which answers 503 unavailable
// here, nothing listening at the Proxmox address), a non-member is refused
// by the file system.
func TestSocketGroup(t *testing.T) {
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-socket-group"})
	b.install(v1)
	b.requireGuardInForce()
	b.sh("groupadd sbxusers && useradd -M -G sbxusers alice && useradd -M bob && " +
		"echo 00000000-0000-0000-0000-000000000000 > /etc/pve-inspectd/pve-token && chmod 600 /etc/pve-inspectd/pve-token")
	cfg := "[guard]\nmgmt_rules = false\n[api]\nenabled = true\nsocket_group = \"sbxusers\"\n[api.proxmox]\nca_file = \"\"\n"
	if err := b.WriteFile(b.ctx, "/etc/pve-inspectd/config.toml", []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("systemctl", "restart", "pve-inspectd.service")
	b.eventually(60*time.Second, "the API socket", func() bool {
		_, err := b.Exec(b.ctx, "test", "-S", "/run/pve-inspectd/api.sock")
		return err == nil
	})
	if got := strings.TrimSpace(b.run("stat", "-c", "%a %G", "/run/pve-inspectd", "/run/pve-inspectd/api.sock")); got != "710 sbxusers\n660 sbxusers" {
		t.Errorf("runtime directory and socket: %q, want 710 and 660, group sbxusers", got)
	}
	list := func(user string) (string, error) {
		out, err := b.Exec(b.ctx, "runuser", "-u", user, "--", "pve-inspectd", "sandbox", "list", "--socket", "/run/pve-inspectd/api.sock")
		return string(out), err
	}
	b.eventually(60*time.Second, "the API answering a member of the group", func() bool {
		out, _ := list("alice")
		return strings.Contains(out, "unavailable")
	})
	if out, err := list("bob"); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("a user outside the group: %v %q, want permission denied", err, out)
	}
	if p := b.show("pve-inspectd.service", "ActiveState"); p["ActiveState"] != "active" {
		t.Errorf("daemon %v with the API unable to reach Proxmox", p)
	}
}

// TestDaemonSandboxBlockDevice: the shipped drop-in's block-device lines
// (for LVM and ZFS transfer storages) work. A block device node the test
// makes (a loop device, the one block device class the test host can
// create; the drop-in's classes are device-mapper and zvol) is refused
// under the unit alone (PrivateDevices=yes hides it), refused with the
// drop-in's lines as shipped (DevicePolicy=closed admits only the listed
// classes), and opened, written and read back with the drop-in whose
// DeviceAllow= names the device's class.
func TestDaemonSandboxBlockDevice(t *testing.T) {
	testkit.RequireRoot(t, "losetup")
	v1, _ := debs(t)
	img := filepath.Join(t.TempDir(), "blk.img")
	if err := os.WriteFile(img, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v %s", loop, err, out)
		}
	})
	var st syscall.Stat_t
	if err := syscall.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)

	b := boot(t, sysbox.Options{Name: "pkg-sandbox-blk"})
	b.install(v1)
	// The container's /dev is the kernel's one devtmpfs (systemd mounts
	// it), shared with the host: the node gets a name of this run and goes
	// when the test ends.
	node := "/dev/pvei-probe-" + filepath.Base(b.Name())
	b.run("mknod", node, "b", strconv.Itoa(int(major)), strconv.Itoa(int(minor)))
	t.Cleanup(func() {
		if _, err := b.Exec(context.Background(), "rm", "-f", node); err != nil {
			t.Errorf("remove %s: %v", node, err)
		}
	})
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	example := b.run("cat", "/usr/share/doc/pve-inspectd/examples/transfer-storage.conf")
	for _, l := range []string{"#PrivateDevices=no", "#DeviceAllow=block-device-mapper rw", "#DeviceAllow=block-zvol rw"} {
		if !strings.Contains(example, l+"\n") && !strings.HasSuffix(example, l) {
			t.Fatalf("the example drop-in has no %q line:\n%s", l, example)
		}
	}
	shipped := strings.NewReplacer("#PrivateDevices=", "PrivateDevices=", "#DeviceAllow=", "DeviceAllow=").Replace(example)
	const dropin = "/etc/systemd/system/pve-inspectd-blkprobe.service.d/transfer-storage.conf"
	for _, tc := range []struct {
		name   string
		dropin string
		ok     bool
	}{
		{"the unit alone", "", false},
		{"the drop-in as shipped (device-mapper, zvol)", shipped, false},
		{"the drop-in naming the device's class", strings.Replace(shipped, "DeviceAllow=block-device-mapper rw", "DeviceAllow=block-loop rw", 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &box{Container: b.Container, t: t, ctx: b.ctx}
			b.run("rm", "-rf", filepath.Dir(dropin))
			if tc.dropin != "" {
				b.run("mkdir", "-p", filepath.Dir(dropin))
				if err := b.WriteFile(b.ctx, dropin, []byte(tc.dropin), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			script := `dd if=/dev/urandom of=/tmp/src bs=1M count=2 status=none && dd if=/tmp/src of="$0" bs=1M conv=fsync status=none && cmp -n 2097152 /tmp/src "$0"`
			probe, err := sandboxedAs(unit, "/bin/sh -c '"+script+"' "+node)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-blkprobe.service", []byte(probe), 0o644); err != nil {
				t.Fatal(err)
			}
			b.run("systemctl", "daemon-reload")
			_, err = b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-blkprobe.service")
			if (err == nil) != tc.ok {
				j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "5", "-u", "pve-inspectd-blkprobe.service")
				t.Fatalf("block device %s under the daemon's sandbox: err=%v, want ok=%v\n%s", node, err, tc.ok, j)
			}
		})
	}
}

// TestDaemonSandboxAgentSocket: the daemon reaches a guest agent socket in
// its qga_dir (/var/run/qemu-server by default) under the unit's sandbox:
// connect(2) to a socket in a directory that ProtectSystem=strict and a
// read-only bind make read-only works. The socket is the host's (a test
// listener in a host directory bound into the container, as the bed's
// QGADir would be), and the probe under the unit's exact sandbox writes to
// it with util-linux logger over a stream socket.
func TestDaemonSandboxAgentSocket(t *testing.T) {
	testkit.RequireRoot(t)
	v1, _ := debs(t)
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "100.qga"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() { // owned by the test: ends when ln is closed
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		buf := make([]byte, 4096)
		n, _ := io.ReadAtLeast(c, buf, 1)
		got <- string(buf[:n])
	}()
	b := boot(t, sysbox.Options{Name: "pkg-sandbox-qga", Binds: []sysbox.Bind{{Source: dir, Target: "/var/run/qemu-server", ReadOnly: true}}})
	b.install(v1)
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	probe, err := sandboxedAs(unit, "/usr/bin/logger -T -u /var/run/qemu-server/100.qga --socket-errors=on pvei-agent-probe")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-qgaprobe.service", []byte(probe), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("systemctl", "daemon-reload")
	if out, err := b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-qgaprobe.service"); err != nil {
		j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "10", "-u", "pve-inspectd-qgaprobe.service")
		t.Fatalf("connect to the agent socket under the daemon's sandbox: %v %s\n%s", err, out, j)
	}
	select {
	case msg := <-got:
		if !strings.Contains(msg, "pvei-agent-probe") {
			t.Fatalf("the socket got %q", msg)
		}
	case <-time.After(time.Minute):
		t.Fatal("nothing arrived on the agent socket")
	}
	if _, err := b.Exec(b.ctx, "touch", "/var/run/qemu-server/new"); err == nil {
		t.Error("the agent directory's bind is writable; the probe proves nothing about a read-only path")
	}
}

// apiAddr is where apiListener listens: Proxmox's API port in a network
// namespace of the test's, across a veth pair from the container.
const apiAddr = "198.51.100.1:8006"

// apiListener makes a network namespace joined to the container's by a
// veth pair (198.51.100.1 there, 198.51.100.2 in the container) and
// listens on apiAddr in it; both go when the test ends.
func (b *box) apiListener() net.Listener {
	b.t.Helper()
	api := testkit.NewNetNS(b.t, "pvei-api-")
	api.IP(b.t, "link", "add", "emu0", "type", "veth", "peer", "name", "api0", "netns", strconv.Itoa(b.PID()))
	api.IP(b.t, "addr", "add", "198.51.100.1/30", "dev", "emu0")
	api.IP(b.t, "link", "set", "emu0", "up")
	b.sh("ip addr add 198.51.100.2/30 dev api0 && ip link set api0 up")
	h := api.Handle()
	var ln net.Listener
	if err := nsrun.Do(&h, func() error {
		var err error
		ln, err = net.Listen("tcp", apiAddr)
		return err
	}); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// TestDaemonSandboxReachesAPI: from the container's network namespace,
// with the installed daemon running (its guard in force) and under the
// unit's exact sandbox, a TCP connection reaches a listener on Proxmox's
// API port in a network namespace the test creates, joined to the
// container's by a veth pair: the path the daemon takes to an emulator
// there. Nothing is in the machine's own namespace.
func TestDaemonSandboxReachesAPI(t *testing.T) {
	testkit.RequireRoot(t, "ip")
	v1, _ := debs(t)
	b := boot(t, sysbox.Options{Name: "pkg-sandbox-api"})
	b.install(v1)
	b.requireGuardInForce()
	ln := b.apiListener()
	go func() { // owned by the test: ends when ln is closed
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("pvei-api-hello\n"))
			c.Close()
		}
	}()
	unit := b.run("cat", "/usr/lib/systemd/system/pve-inspectd.service")
	script := `exec 3<>/dev/tcp/198.51.100.1/8006 && read -r l <&3 && [ "$l" = pvei-api-hello ]`
	probe, err := sandboxedAs(unit, "/bin/bash -c '"+script+"'")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WriteFile(b.ctx, "/etc/systemd/system/pve-inspectd-apiprobe.service", []byte(probe), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("systemctl", "daemon-reload")
	if out, err := b.Exec(b.ctx, "systemctl", "start", "pve-inspectd-apiprobe.service"); err != nil {
		j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "10", "-u", "pve-inspectd-apiprobe.service")
		t.Fatalf("reach the API port under the daemon's sandbox: %v %s\n%s", err, out, j)
	}
}
