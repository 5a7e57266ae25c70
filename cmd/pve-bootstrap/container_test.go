package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/provision"
	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// buildDeb makes a small .deb with dpkg-deb and returns its path.
func buildDeb(t *testing.T, dir, name, version, arch string, files map[string]string) string {
	t.Helper()
	pkg := filepath.Join(dir, name+"-pkg")
	control := fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: pve-inspect tests <tests@pve-inspect.invalid>\nDescription: %s for the pve-bootstrap container test\n", name, version, arch, name)
	files["DEBIAN/control"] = control
	for p, c := range files {
		full := filepath.Join(pkg, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, fmt.Sprintf("%s_%s_%s.deb", name, version, arch))
	if b, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, b)
	}
	return out
}

// packagesEntry is the stanza of a flat apt repository's Packages file.
func packagesEntry(t *testing.T, deb, name, version, arch string) string {
	b, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: %s\nMaintainer: pve-inspect tests <tests@pve-inspect.invalid>\nFilename: ./%s\nSize: %d\nSHA256: %s\nDescription: %s stand-in\n\n",
		name, version, arch, filepath.Base(deb), len(b), hex.EncodeToString(sum[:]), name)
}

// TestRecipeInSystemdContainer applies the steps that need no Proxmox
// package in a real systemd container, with a local apt repository holding a
// stand-in proxmox-default-kernel so the recipe's reboot happens: the
// container restarts, the oneshot unit resumes apply at the right step and
// removes itself; a second apply changes nothing.
func TestRecipeInSystemdContainer(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := t.TempDir()

	bin := filepath.Join(dir, "pve-bootstrap")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	kernelDeb := buildDeb(t, dir, "proxmox-default-kernel", "9.0", "all", map[string]string{"usr/share/doc/proxmox-default-kernel/README": "stand-in\n"})
	// The real package of the packaging issue, built as `make deb` builds it.
	debDir := filepath.Join(dir, "deb")
	if out, err := exec.Command("make", "-C", "../..", "deb", "DIST="+debDir, "BIN="+filepath.Join(dir, "bin")).CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(debDir, "pve-inspectd_*_amd64.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb built %q", debs)
	}
	inspectd := mustRead(t, debs[0])
	kernel, _ := os.ReadFile(kernelDeb)

	var rnd [2]byte
	rand.Read(rnd[:])
	veth := "pbt" + hex.EncodeToString(rnd[:])
	cfg := fmt.Sprintf(`hostname = "pve1"
domain = "example.test"
skip = ["proxmox-repo", "proxmox-ve", "enterprise-repo-off", "network-bridge", "storage-content"]

[inspectd]
source = "/srv/pve-inspectd.deb"
sha256 = %q
`, provision.SHA256Hex(inspectd))
	// bootenv gives every boot what a container manager gives a container:
	// a boot id of its own (systemd-nspawn does the same; boot_id is not
	// namespaced) and a network with a default route.
	bootenv := `[Unit]
Description=Test bed: per-boot boot id and a routed interface
DefaultDependencies=no
Before=network-online.target pve-bootstrap-resume.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'cat /proc/sys/kernel/random/uuid > /run/boot_id && mount --bind /run/boot_id /proc/sys/kernel/random/boot_id'
ExecStart=/bin/sh -c 'ip link add ` + veth + ` type veth peer name ` + veth + `p && ip link set ` + veth + ` up && ip link set ` + veth + `p up && ip addr add 192.0.2.10/24 dev ` + veth + ` && ip route add default via 192.0.2.1'

[Install]
WantedBy=multi-user.target
`
	c, err := sysbox.Start(ctx, sysbox.Options{
		Name:        "bootstrap",
		Rootfs:      sysbox.RootfsOptions{Packages: []string{"dnsmasq", "openssl", "procps", "iproute2", "nftables"}},
		Units:       map[string]string{"pbt-bootenv.service": bootenv},
		Enable:      []string{"pbt-bootenv.service"},
		NoStandIns:  true,
		BootTimeout: 5 * time.Minute,
		Files: []sysbox.File{
			{Path: "/usr/local/bin/pve-bootstrap", Data: mustRead(t, bin), Mode: 0o755},
			{Path: "/etc/pve-bootstrap/config.toml", Data: []byte(cfg), Mode: 0o600},
			{Path: "/srv/pve-inspectd.deb", Data: inspectd},
			{Path: "/srv/repo/" + filepath.Base(kernelDeb), Data: kernel},
			{Path: "/srv/repo/Packages", Data: []byte(packagesEntry(t, kernelDeb, "proxmox-default-kernel", "9.0", "all"))},
			{Path: "/etc/apt/sources.list", Data: []byte("deb [trusted=yes] file:/srv/repo ./\n")},
			{Path: "/etc/resolv.conf", Data: []byte("nameserver 192.0.2.53\n")},
			{Path: "/var/lib/cloud/data/instance-id", Data: []byte("i-sysbox-0001\n")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	state := func() provision.State {
		b, err := c.ReadFile(ctx, provision.StatePath)
		if err != nil {
			t.Fatalf("state: %v", err)
		}
		var s provision.State
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("state: %v\n%s", err, b)
		}
		return s
	}

	// First apply: runs up to the stand-in kernel and asks for a reboot.
	out, err := c.Exec(ctx, "pve-bootstrap", "node", "apply")
	// systemctl reboot may end the container under our feet: judge by state.
	if !strings.Contains(string(out), "rebooting") && c.PID() != 0 {
		if _, perr := c.Exec(ctx, "true"); perr == nil {
			t.Fatalf("first apply did not reboot: %v\n%s", err, out)
		}
	}
	// The state is on the overlay's upper directory: read it after the boot.
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// Booting ran the resume unit to completion (multi-user.target waits for
	// the oneshot), so by now the recipe is done.
	st := state()
	if st.Completed.IsZero() || st.Reboot != nil {
		log, _ := c.Exec(ctx, "journalctl", "--no-pager", "-u", provision.ResumeUnit)
		t.Fatalf("not completed after the reboot: %+v\njournal:\n%s", st, log)
	}
	if k := st.Steps["proxmox-kernel"]; k.Status != provision.StatusDone || !k.Applied || k.BootID == st.BootID {
		t.Errorf("proxmox-kernel state %+v (final boot %s)", k, st.BootID)
	}
	if s := st.Steps["secrets"]; s.BootID != st.BootID || !s.Applied {
		t.Errorf("secrets not applied in the resumed boot: %+v", s)
	}
	journal, _ := c.Exec(ctx, "journalctl", "--no-pager", "-u", provision.ResumeUnit)
	if !strings.Contains(string(journal), "node complete") {
		t.Errorf("the resume unit did not finish the recipe:\n%s", journal)
	}
	if _, err := c.ReadFile(ctx, provision.ResumeUnitAt); err == nil {
		t.Error("resume unit still installed")
	}
	if out, _ := c.Exec(ctx, "systemctl", "is-enabled", provision.ResumeUnit); !strings.Contains(string(out), "No such file") && !strings.Contains(string(out), "not-found") && strings.TrimSpace(string(out)) != "" {
		t.Errorf("resume unit still known to systemd: %s", out)
	}
	checks := map[string][]string{
		"dnsmasq disabled":      {"systemctl", "is-enabled", "dnsmasq.service"},
		"pve-inspectd":          {"dpkg-query", "-W", "-f=${db:Status-Status}", "pve-inspectd"},
		"kernel stand-in":       {"dpkg-query", "-W", "-f=${db:Status-Status}", "proxmox-default-kernel"},
		"hostname":              {"cat", "/etc/hostname"},
		"root password is hash": {"sh", "-c", "getent shadow root | cut -d: -f2 | cut -c1-3"},
		"ip_forward":            {"sysctl", "-n", "net.ipv4.ip_forward"},
		"hosts":                 {"grep", "-c", "192.0.2.10\tpve1.example.test pve1", "/etc/hosts"},
	}
	want := map[string]string{
		"dnsmasq disabled": "disabled", "pve-inspectd": "installed", "kernel stand-in": "installed",
		"hostname": "pve1", "root password is hash": "$6$", "ip_forward": "1", "hosts": "1",
	}
	for name, argv := range checks {
		out, _ := c.Exec(ctx, argv...)
		if got := strings.TrimSpace(string(out)); got != want[name] {
			t.Errorf("%s: %q, want %q", name, got, want[name])
		}
	}

	// The installed daemon runs with its guard in force.
	if out, err := c.Exec(ctx, "pve-inspectd", "status"); err != nil {
		t.Errorf("pve-inspectd status after the recipe: %v\n%s", err, out)
	}

	// Second apply: nothing changes.
	before, _ := c.ReadFile(ctx, provision.StatePath)
	stamps := func() string {
		out, _ := c.Exec(ctx, "stat", "-c", "%n %Y %s", "/etc/hostname", "/etc/hosts", provision.SysctlPath, provision.ResolverTmpfiles, "/etc/shadow")
		return string(out)
	}
	s1 := stamps()
	time.Sleep(1100 * time.Millisecond) // mtimes have one-second resolution in stat -c %Y
	out, err = c.Exec(ctx, "pve-bootstrap", "node", "apply")
	if err != nil || !strings.Contains(string(out), "node complete") {
		t.Fatalf("second apply: %v\n%s", err, out)
	}
	after, _ := c.ReadFile(ctx, provision.StatePath)
	if string(before) != string(after) {
		t.Errorf("second apply changed state.json:\n%s\n---\n%s", before, after)
	}
	if s2 := stamps(); s1 != s2 {
		t.Errorf("second apply rewrote files:\n%s---\n%s", s1, s2)
	}
	status, err := c.Exec(ctx, "pve-bootstrap", "node", "status", "--json")
	if err != nil || !strings.Contains(string(status), `"status": "skipped"`) {
		t.Errorf("status: %v\n%s", err, status)
	}

	// An image of this node launched again: a new instance id. The
	// identity step makes a new root password (kept in /root/root-password)
	// and rewrites host name and hosts; every other step's files stay.
	pw1, _ := c.ReadFile(ctx, provision.DefaultRootPasswordFile)
	if len(strings.TrimSpace(string(pw1))) < 32 {
		t.Fatalf("no generated root password kept: %q", pw1)
	}
	if out, _ := c.Exec(ctx, "stat", "-c", "%a", provision.DefaultRootPasswordFile); strings.TrimSpace(string(out)) != "600" {
		t.Errorf("%s mode %s, want 600", provision.DefaultRootPasswordFile, out)
	}
	others := func() string {
		out, _ := c.Exec(ctx, "stat", "-c", "%n %Y %s", provision.SysctlPath, provision.ResolverTmpfiles, "/etc/pve-bootstrap/config.toml")
		return string(out)
	}
	o1 := others()
	out, err = c.Exec(ctx, "pve-bootstrap", "node", "identity")
	if err != nil || !strings.Contains(string(out), "nothing to do") {
		t.Fatalf("identity on the same instance: %v\n%s", err, out)
	}
	if _, err := c.Exec(ctx, "sh", "-c", "mkdir -p /var/lib/cloud/data && echo i-0new0000000000001 > /var/lib/cloud/data/instance-id && echo ip-192-0-2-10 > /etc/hostname"); err != nil {
		t.Fatal(err)
	}
	// The recipe's boot unit does it, as at the first boot of an instance
	// launched from an image of this node.
	if out, err := c.Exec(ctx, "systemctl", "is-enabled", provision.IdentityUnit); err != nil || strings.TrimSpace(string(out)) != "enabled" {
		t.Errorf("%s not enabled: %v %s", provision.IdentityUnit, err, out)
	}
	if out, err := c.Exec(ctx, "systemctl", "start", provision.IdentityUnit); err != nil {
		t.Fatalf("identity unit on a new instance: %v\n%s", err, out)
	}
	if out, _ := c.Exec(ctx, "journalctl", "-u", provision.IdentityUnit, "--no-pager"); !strings.Contains(string(out), "instance i-0new0000000000001: new identity made") {
		t.Errorf("identity unit's journal:\n%s", out)
	}
	if pw2, _ := c.ReadFile(ctx, provision.DefaultRootPasswordFile); string(pw2) == string(pw1) {
		t.Error("root password not regenerated on the new instance")
	}
	if out, _ := c.Exec(ctx, "cat", "/etc/hostname"); strings.TrimSpace(string(out)) != "pve1" {
		t.Errorf("hostname after identity: %q", out)
	}
	if o2 := others(); o1 != o2 {
		t.Errorf("identity touched files of other steps:\n%s---\n%s", o1, o2)
	}
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
