package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeNode is a recording runner that also simulates the parts of a Debian
// machine the recipe drives: dpkg's database, apt, systemctl, pvesh, pveum.
type fakeNode struct {
	t              *testing.T
	root           Root
	calls          []Cmd
	pkgs           map[string]bool
	dnsmasqEnabled bool
	storage        string
	failPrefix     string
	failOutput     string
	tokens         int
}

func newFakeNode(t *testing.T, root Root) *fakeNode {
	return &fakeNode{t: t, root: root, pkgs: map[string]bool{
		"linux-image-amd64": true, "linux-image-6.12.48+deb13-amd64": true, "os-prober": true,
	}}
}

var fakeHash = "$6$saltsalt$" + strings.Repeat("aB3./", 17) + "x"

func (f *fakeNode) Run(_ context.Context, c Cmd) (Result, error) {
	f.calls = append(f.calls, c)
	line := c.String()
	exit := func(code int, out string) (Result, error) {
		r := Result{Stdout: []byte(out)}
		return r, &ExitError{Cmd: line, Code: code, Result: r}
	}
	if f.failPrefix != "" && strings.HasPrefix(line, f.failPrefix) {
		return exit(100, f.failOutput)
	}
	ok := func(out string) (Result, error) { return Result{Stdout: []byte(out)}, nil }
	switch c.Argv[0] {
	case "dpkg-query":
		var out strings.Builder
		missing := false
		for _, pat := range c.Argv[3:] {
			found := false
			for _, p := range slices.Sorted(mapsKeys(f.pkgs)) {
				if m, _ := path.Match(pat, p); m && f.pkgs[p] {
					fmt.Fprintf(&out, "%s\tinstalled\n", p)
					found = true
				}
			}
			missing = missing || !found
		}
		if missing {
			return exit(1, out.String())
		}
		return ok(out.String())
	case "apt-get":
		i := slices.IndexFunc(c.Argv, func(a string) bool {
			return a == "install" || a == "remove" || a == "update" || a == "full-upgrade"
		})
		switch c.Argv[i] {
		case "install":
			for _, p := range c.Argv[i+1:] {
				if strings.HasPrefix(p, "--") {
					continue
				}
				if p == InspectdDebCache {
					p = "pve-inspectd"
					must(f.t, f.root.WriteFile(AccessSetupPath, []byte("#!/bin/sh\n"), 0o755))
					if f.root.Exists("/usr/sbin/pveum") {
						// The package's postinst runs its access setup.
						f.tokens++
						must(f.t, f.root.WriteFile(TokenPath, fmt.Appendf(nil, `{"value":"tok-%d"}`, f.tokens), 0o600))
					}
				}
				f.pkgs[p] = true
				if p == "dnsmasq" {
					f.dnsmasqEnabled = true
				}
				if p == "proxmox-ve" {
					f.storage = "iso,vztmpl,backup"
					for _, s := range enterpriseSources {
						must(f.t, f.root.WriteFile(s, []byte("Types: deb\nURIs: https://enterprise.proxmox.com/debian/pve\n"), 0o644))
					}
					must(f.t, f.root.WriteFile("/usr/sbin/pveum", []byte("#!/bin/sh\n"), 0o755))
					must(f.t, f.root.WriteFile("/usr/bin/pvecm", []byte("#!/bin/sh\n"), 0o755))
				}
			}
		case "remove":
			for _, p := range c.Argv[i+1:] {
				delete(f.pkgs, p)
			}
		}
		return ok("")
	case "systemctl":
		switch {
		case line == "systemctl is-enabled dnsmasq.service":
			if f.dnsmasqEnabled {
				return ok("enabled\n")
			}
			return exit(1, "disabled\n")
		case line == "systemctl disable --now dnsmasq.service":
			f.dnsmasqEnabled = false
		case line == "systemctl enable "+IdentityUnit: // as systemctl does: the wants link
			p := f.root.Path(identityWants)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return exit(1, err.Error())
			}
			_ = os.Symlink(IdentityUnitAt, p)
		}
		return ok("")
	case "pvesh":
		if !f.pkgs["proxmox-ve"] {
			return exit(127, "pvesh: not found")
		}
		return ok(fmt.Sprintf(`{"content":%q,"type":"dir"}`, f.storage))
	case "pvesm":
		f.storage = c.Argv[len(c.Argv)-1]
		return ok("")
	case "openssl":
		return ok(fakeHash + "\n")
	case AccessSetupPath:
		if !f.root.Exists(TokenPath) {
			f.tokens++
			must(f.t, f.root.WriteFile(TokenPath, fmt.Appendf(nil, `{"value":"tok-%d"}`, f.tokens), 0o600))
		}
		return ok("")
	case "dpkg", "pvecm", "/usr/local/bin/store-secret", "hostname", "sysctl", "systemd-tmpfiles", "debconf-set-selections", "update-grub", "ifreload", "chpasswd":
		return ok("")
	}
	return exit(127, "unexpected command "+line)
}

func (f *fakeNode) lines() []string {
	var out []string
	for _, c := range f.calls {
		out = append(out, c.String())
	}
	return out
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type staticFetcher map[string][]byte

func (s staticFetcher) Fetch(_ context.Context, src, want string) ([]byte, error) {
	b, ok := s[src]
	if !ok {
		return nil, fmt.Errorf("fetch %s: not found", src)
	}
	if got := SHA256Hex(b); got != want {
		return nil, &ChecksumError{Source: src, Want: want, Got: got, Algorithm: "sha256"}
	}
	return b, nil
}

var (
	testKeyring = []byte("not really a keyring")
	testDeb     = []byte("!<arch>\nnot really a deb")
)

func testConfig() Config {
	c := DefaultConfig()
	c.Hostname = "pve1"
	c.Domain = "example.test"
	c.Proxmox.KeyringSHA256 = SHA256Hex(testKeyring)
	c.Inspectd = DebConfig{Source: "https://files.example.test/pve-inspectd_1.0_amd64.deb", SHA256: SHA256Hex(testDeb)}
	return c
}

// fixture builds a fixture root holding what a fresh Debian 13 cloud
// instance has that the recipe reads.
func fixture(t *testing.T) Root {
	t.Helper()
	root := Root(t.TempDir())
	must(t, root.WriteFile(BootIDPath, []byte("11111111-1111-1111-1111-111111111111\n"), 0o444))
	must(t, root.WriteFile(instanceID, []byte("i-0123456789abcdef0\n"), 0o644))
	must(t, root.WriteFile(HostnamePath, []byte("localhost\n"), 0o644))
	must(t, root.WriteFile(HostsPath, []byte("127.0.0.1 localhost\n127.0.1.1 debian\n"), 0o644))
	must(t, root.WriteFile(interfacesPath, []byte("auto lo\niface lo inet loopback\n"), 0o644))
	return root
}

func newTestEngine(t *testing.T, root Root, node Runner, cfg Config) *Engine {
	t.Helper()
	return &Engine{
		Env: &Env{
			Config: cfg, Root: root, Runner: node,
			Addrs:        StaticAddr{Interface: "ens5", Prefix: netip.MustParsePrefix("172.31.5.17/20")},
			Fetcher:      staticFetcher{cfg.Proxmox.KeyringURL: testKeyring, cfg.Inspectd.Source: testDeb},
			Log:          slog.New(slog.NewTextHandler(io.Discard, nil)),
			Random:       bytes.NewReader(bytes.Repeat([]byte{0x5a}, 64)),
			IdentityArgv: []string{"/usr/local/bin/pve-bootstrap", "node", "identity", "--config", "/etc/pve-bootstrap/config.toml"},
		},
		Steps:      Recipe(),
		ResumeArgv: []string{"/usr/local/bin/pve-bootstrap", "node", "apply", "--config", "/etc/pve-bootstrap/config.toml"},
		Locks:      noLocks{},
		Poll:       time.Millisecond,
		LockWait:   time.Second,
		Now:        func() time.Time { return time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC) },
	}
}

type noLocks struct{}

func (noLocks) Held(string) (bool, error) { return false, nil }

// reEngine is a fresh process: state is loaded again from disk.
func reEngine(t *testing.T, e *Engine) *Engine {
	n := *e
	env := *e.Env
	env.State = nil
	n.Env = &env
	return &n
}

func TestApplyResumesAcrossRebootAndIsIdempotent(t *testing.T) {
	ctx := context.Background()
	root := fixture(t)
	node := newFakeNode(t, root)
	e := newTestEngine(t, root, node, testConfig())
	var reports []string
	e.Report = func(_ context.Context, step, status string) error {
		reports = append(reports, step+"="+status)
		return errors.New("tags unavailable") // must not stop the recipe
	}

	// First run: stops for the reboot after the Proxmox kernel.
	out, err := e.Apply(ctx)
	if err != nil || out != Rebooting {
		t.Fatalf("first apply = %v, %v; want Rebooting", out, err)
	}
	lines := node.lines()
	for _, want := range []string{"dpkg --audit", "systemctl daemon-reload", "systemctl enable " + ResumeUnit, "systemctl reboot"} {
		if !slices.Contains(lines, want) {
			t.Errorf("before reboot: missing %q in %q", want, lines)
		}
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "proxmox-ve") }) {
		t.Errorf("proxmox-ve touched before the reboot: %q", lines)
	}
	unit, err := root.ReadFile(ResumeUnitAt)
	must(t, err)
	if !strings.Contains(string(unit), `ExecStart="/usr/local/bin/pve-bootstrap" "node" "apply" "--config" "/etc/pve-bootstrap/config.toml"`) {
		t.Errorf("unit ExecStart wrong:\n%s", unit)
	}
	if !node.pkgs["proxmox-default-kernel"] {
		t.Error("proxmox kernel not installed before reboot")
	}

	// The reboot did not happen (same boot id): apply asks for it again and
	// applies nothing.
	node.calls = nil
	out, err = reEngine(t, e).Apply(ctx)
	if err != nil || out != Rebooting {
		t.Fatalf("same-boot apply = %v, %v; want Rebooting", out, err)
	}
	if l := node.lines(); l[len(l)-1] != "systemctl reboot" || slices.ContainsFunc(l, func(s string) bool { return strings.HasPrefix(s, "apt-get") }) {
		t.Errorf("same-boot apply ran %q", l)
	}

	// After the reboot: new boot id; the recipe completes and the unit goes.
	must(t, root.WriteFile(BootIDPath, []byte("22222222-2222-2222-2222-222222222222\n"), 0o444))
	node.calls = nil
	out, err = reEngine(t, e).Apply(ctx)
	if err != nil || out != Completed {
		t.Fatalf("resumed apply = %v, %v; want Completed", out, err)
	}
	if root.Exists(ResumeUnitAt) {
		t.Error("resume unit still present after completion")
	}
	// First instance: the token the package made at install is kept, and
	// the certificate Proxmox just made is not replaced.
	if slices.Contains(lines, AccessSetupPath) || slices.Contains(lines, "pvecm updatecerts --force") {
		t.Errorf("first instance replaced install-time secrets: %q", lines)
	}
	if tok, _ := root.ReadFile(TokenPath); string(tok) != `{"value":"tok-1"}` {
		t.Errorf("token %q", tok)
	}
	for _, want := range []string{"proxmox-kernel=running", "proxmox-kernel=rebooting", "secrets=running", "=done"} {
		if !slices.Contains(reports, want) {
			t.Errorf("reports %q lack %q", reports, want)
		}
	}
	lines = node.lines()
	for _, want := range []string{
		"debconf-set-selections",
		"apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install proxmox-ve postfix open-iscsi chrony",
		"apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold remove linux-image-6.12.48+deb13-amd64 linux-image-amd64 os-prober",
		"update-grub",
		"systemctl disable --now dnsmasq.service",
		"pvesm set local --content backup,images,import,iso,rootdir,snippets,vztmpl",
		"apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install --no-install-recommends " + InspectdDebCache,
		"chpasswd -e",
		"systemctl disable " + ResumeUnit,
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("resumed apply: missing %q", want)
		}
	}
	for _, c := range node.calls {
		if c.Argv[0] == "apt-get" && !slices.Contains(c.Env, "DEBIAN_FRONTEND=noninteractive") {
			t.Errorf("%s runs without DEBIAN_FRONTEND=noninteractive", c)
		}
		if c.Argv[0] == "debconf-set-selections" && !strings.Contains(string(c.Stdin), "postfix postfix/main_mailer_type select Local only") {
			t.Errorf("debconf answers missing postfix: %q", c.Stdin)
		}
	}
	for _, p := range enterpriseSources {
		b, err := root.ReadFile(p)
		must(t, err)
		if !enterpriseOff(b) {
			t.Errorf("%s not switched off:\n%s", p, b)
		}
	}
	hosts, err := root.ReadFile(HostsPath)
	must(t, err)
	if !strings.Contains(string(hosts), "172.31.5.17\tpve1.example.test pve1\n") || strings.Contains(string(hosts), "127.0.1.1\t") {
		t.Errorf("hosts:\n%s", hosts)
	}
	ifaces, err := root.ReadFile(interfacesPath)
	must(t, err)
	if !strings.HasPrefix(string(ifaces), "auto lo\niface lo inet loopback\n") || !sourcesInterfacesD(ifaces) {
		t.Errorf("interfaces:\n%s", ifaces)
	}
	bridge, err := root.ReadFile("/etc/network/interfaces.d/pve-inspect-vmbr0")
	must(t, err)
	for _, want := range []string{"address 10.10.0.1/24", "bridge-ports none", "-s 10.10.0.0/24 -o ens5 -j MASQUERADE"} {
		if !strings.Contains(string(bridge), want) {
			t.Errorf("bridge file lacks %q:\n%s", want, bridge)
		}
	}
	key, err := root.ReadFile(KeyringPath)
	must(t, err)
	if !bytes.Equal(key, testKeyring) {
		t.Error("keyring not written")
	}

	// Second apply: only read-only checks, no file rewritten.
	stateBefore, err := root.ReadFile(StatePath)
	must(t, err)
	snap := snapshot(t, root)
	node.calls = nil
	out, err = reEngine(t, e).Apply(ctx)
	if err != nil || out != Completed {
		t.Fatalf("second apply = %v, %v", out, err)
	}
	for _, l := range node.lines() {
		if !strings.HasPrefix(l, "dpkg-query -W") && l != "systemctl is-enabled dnsmasq.service" && !strings.HasPrefix(l, "pvesh get ") {
			t.Errorf("second apply ran a changing command: %q", l)
		}
	}
	stateAfter, err := root.ReadFile(StatePath)
	must(t, err)
	if !bytes.Equal(stateBefore, stateAfter) {
		t.Errorf("second apply rewrote state:\n%s\n---\n%s", stateBefore, stateAfter)
	}
	if after := snapshot(t, root); after != snap {
		t.Errorf("second apply changed files:\n%s\n---\n%s", snap, after)
	}

	// Plan on the finished node: nothing to do.
	items, err := reEngine(t, e).Plan(ctx)
	must(t, err)
	for _, it := range items {
		if it.Action != "none" {
			t.Errorf("plan after completion: %s action %s", it.ID, it.Action)
		}
	}
}

// snapshot lists every file under root with size and modification time.
func snapshot(t *testing.T, root Root) string {
	var b strings.Builder
	must(t, filepath.Walk(string(root), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s %d\n", p, fi.Size(), fi.Mode(), fi.ModTime().UnixNano())
		return nil
	}))
	return b.String()
}

// TestSecretsNeverInClearAndFreshPerInstance: the generated root password
// is in no argv and no file except secrets.root_password_file (0600, the
// reference's /root/root-password); each instance gets a fresh one.
func TestSecretsNeverInClearAndFreshPerInstance(t *testing.T) {
	ctx := context.Background()
	root := fixture(t)
	node := newFakeNode(t, root)
	cfg := testConfig()
	cfg.Secrets.Sink = []string{"/usr/local/bin/store-secret", "root-password"}
	must(t, root.WriteFile("/usr/sbin/pveum", []byte("#!/bin/sh\n"), 0o755))
	must(t, root.WriteFile("/usr/bin/pvecm", []byte("#!/bin/sh\n"), 0o755))
	must(t, root.WriteFile(AccessSetupPath, []byte("#!/bin/sh\n"), 0o755))
	e := newTestEngine(t, root, node, cfg)
	must(t, e.load())
	step := Recipe()[slices.IndexFunc(Recipe(), func(s Step) bool { return s.ID == "secrets" })]
	e.Steps = []Step{step}

	if out, err := e.Apply(ctx); err != nil || out != Completed {
		t.Fatalf("apply = %v, %v", out, err)
	}
	var clear string
	for _, c := range node.calls {
		switch c.Argv[0] {
		case "openssl":
			clear = strings.TrimSpace(string(c.Stdin))
		case "chpasswd":
			if string(c.Stdin) != "root:"+fakeHash+"\n" {
				t.Errorf("chpasswd got %q, want the hash", c.Stdin)
			}
		}
	}
	if len(clear) < 32 {
		t.Fatalf("generated password %q too short", clear)
	}
	for _, c := range node.calls {
		if strings.Contains(c.String(), clear) {
			t.Errorf("clear password in argv: %s", c)
		}
		if c.Argv[0] == "/usr/local/bin/store-secret" && strings.TrimSpace(string(c.Stdin)) != clear {
			t.Errorf("sink got %q", c.Stdin)
		}
	}
	must(t, filepath.Walk(string(root), func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		if p == root.Path(DefaultRootPasswordFile) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(clear)) {
			t.Errorf("clear password written to %s", p)
		}
		return err
	}))
	kept := func() string {
		t.Helper()
		fi, err := os.Stat(root.Path(DefaultRootPasswordFile))
		must(t, err)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", DefaultRootPasswordFile, fi.Mode())
		}
		b, _ := os.ReadFile(root.Path(DefaultRootPasswordFile))
		return strings.TrimSpace(string(b))
	}
	if got := kept(); got != clear {
		t.Errorf("%s holds %q, want the generated password", DefaultRootPasswordFile, got)
	}
	if slices.Contains(node.lines(), "pvecm updatecerts --force") {
		t.Error("first instance replaced the node certificate")
	}
	tokFile := root.Path(TokenPath)
	fi, err := os.Stat(tokFile)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v", fi.Mode())
	}
	tok, _ := os.ReadFile(tokFile)
	if string(tok) != `{"value":"tok-1"}` {
		t.Errorf("token file %q", tok)
	}

	// Same instance: nothing happens. New instance (a clone): fresh secrets.
	node.calls = nil
	if _, err := reEngine(t, e).Apply(ctx); err != nil || len(node.calls) != 0 {
		t.Fatalf("same instance: %v, ran %q", err, node.lines())
	}
	must(t, root.WriteFile(instanceID, []byte("i-0fffffffffffffff0\n"), 0o644))
	e.Env.Random = bytes.NewReader(bytes.Repeat([]byte{0x33}, 64)) // the clone's own entropy
	if _, err := reEngine(t, e).Apply(ctx); err != nil {
		t.Fatal(err)
	}
	tok, _ = os.ReadFile(tokFile)
	if string(tok) != `{"value":"tok-2"}` {
		t.Errorf("clone token file %q", tok)
	}
	if !slices.Contains(node.lines(), "pvecm updatecerts --force") {
		t.Errorf("clone kept the parent's node certificate: %q", node.lines())
	}
	if got := kept(); got == clear || len(got) < 32 {
		t.Errorf("clone's %s = %q: want a fresh password", DefaultRootPasswordFile, got)
	}
}

// TestRootPasswordFileChoices: "" keeps no clear copy; a configured hash
// has no clear text, so nothing is written either.
func TestRootPasswordFileChoices(t *testing.T) {
	for _, tc := range []struct {
		name       string
		file, hash string
	}{
		{name: "no file", file: ""},
		{name: "hash from config", file: DefaultRootPasswordFile, hash: "$6$salt$" + strings.Repeat("a", 86)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fixture(t)
			node := newFakeNode(t, root)
			cfg := testConfig()
			cfg.Secrets.RootPasswordFile, cfg.Secrets.RootPasswordHash = tc.file, tc.hash
			e := newTestEngine(t, root, node, cfg)
			must(t, e.load())
			e.Steps = []Step{Recipe()[slices.IndexFunc(Recipe(), func(s Step) bool { return s.ID == "secrets" })]}
			if out, err := e.Apply(context.Background()); err != nil || out != Completed {
				t.Fatalf("apply = %v, %v", out, err)
			}
			if root.Exists(DefaultRootPasswordFile) {
				t.Errorf("%s written", DefaultRootPasswordFile)
			}
			if done, err := checkSecrets(context.Background(), e.Env); err != nil || !done {
				t.Errorf("check after apply: %v %v", done, err)
			}
		})
	}
}

func TestFailedStepStopsWithOutputAndResume(t *testing.T) {
	ctx := context.Background()
	root := fixture(t)
	node := newFakeNode(t, root)
	node.failPrefix = "apt-get -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold full-upgrade"
	node.failOutput = "E: Could not get lock /var/lib/dpkg/lock-frontend"
	e := newTestEngine(t, root, node, testConfig())
	_, err := e.Apply(ctx)
	var se *StepError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want *StepError", err)
	}
	if se.ID != "full-upgrade" || se.Output != node.failOutput {
		t.Errorf("step error = %+v", se)
	}
	msg := err.Error()
	for _, want := range []string{node.failOutput, "resume with: /usr/local/bin/pve-bootstrap node apply --config /etc/pve-bootstrap/config.toml"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if slices.ContainsFunc(node.lines(), func(l string) bool {
		return strings.Contains(l, "proxmox-default-kernel") && strings.Contains(l, "install")
	}) {
		t.Error("ran a step after the failed one")
	}
	items, st, err := reEngine(t, e).Status()
	must(t, err)
	if st.Steps["full-upgrade"].Status != StatusFailed {
		t.Errorf("state: %+v", st.Steps["full-upgrade"])
	}
	for _, it := range items {
		if it.ID == "hostname" && it.Status != StatusDone || it.ID == "proxmox-kernel" && it.Status != StatusPending {
			t.Errorf("status %s = %s", it.ID, it.Status)
		}
	}
	// Resuming after the cause is gone continues at the failed step.
	node.failPrefix = ""
	node.calls = nil
	if out, err := reEngine(t, e).Apply(ctx); err != nil || out != Rebooting {
		t.Fatalf("resume = %v, %v", out, err)
	}
	if l := node.lines(); slices.Contains(l, "hostname pve1") {
		t.Errorf("resume re-applied a done step: %q", l)
	}
}

func TestRebootWaitsForDpkg(t *testing.T) {
	root := fixture(t)
	rec := &RecordingRunner{Replies: []*Reply{
		{Prefix: "dpkg --audit", Stdout: "The following packages are only half configured:\n foo\n", Times: 1},
		{Prefix: "dpkg --audit"},
	}}
	e := newTestEngine(t, root, rec, testConfig())
	probe := &countingProbe{heldFor: 3}
	e.Locks = probe
	if err := e.waitDpkg(context.Background()); err != nil {
		t.Fatal(err)
	}
	if probe.calls < 3 || len(rec.Calls) != 2 {
		t.Errorf("probe calls %d, audit calls %d", probe.calls, len(rec.Calls))
	}
	// Never clean: a bounded wait that names the cause.
	rec = &RecordingRunner{Replies: []*Reply{{Prefix: "dpkg --audit", Stdout: "broken\n"}}}
	e.Env.Runner, e.Locks, e.LockWait = rec, noLocks{}, 20*time.Millisecond
	if err := e.waitDpkg(context.Background()); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("err = %v", err)
	}
}

type countingProbe struct{ heldFor, calls int }

func (c *countingProbe) Held(string) (bool, error) {
	c.calls++
	return c.calls <= c.heldFor, nil
}

func TestFcntlProbe(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	if held, err := (FcntlProbe{}).Held(p); err != nil || held {
		t.Fatalf("missing file: %v %v", held, err)
	}
	must(t, os.WriteFile(p, nil, 0o600))
	if held, err := (FcntlProbe{}).Held(p); err != nil || held {
		t.Fatalf("unlocked file: %v %v", held, err)
	}
}

func TestPlanChangesNothing(t *testing.T) {
	root := fixture(t)
	node := newFakeNode(t, root)
	e := newTestEngine(t, root, node, testConfig())
	snap := snapshot(t, root)
	items, err := e.Plan(context.Background())
	must(t, err)
	if len(items) != len(Recipe()) {
		t.Fatalf("%d items", len(items))
	}
	for _, it := range items {
		if it.Action != "apply" {
			t.Errorf("fresh node: %s action %s", it.ID, it.Action)
		}
	}
	if snapshot(t, root) != snap {
		t.Error("plan changed files")
	}
	for _, l := range node.lines() {
		if !strings.HasPrefix(l, "dpkg-query") && !strings.HasPrefix(l, "pvesh get") && !strings.HasPrefix(l, "systemctl is-enabled") {
			t.Errorf("plan ran %q", l)
		}
	}
}

func TestApplyIsExclusive(t *testing.T) {
	root := fixture(t)
	e := newTestEngine(t, root, newFakeNode(t, root), testConfig())
	unlock, err := e.lock()
	must(t, err)
	if _, err := reEngine(t, e).Apply(context.Background()); !errors.Is(err, ErrBusy) {
		t.Errorf("second apply while locked: %v", err)
	}
	unlock()
	if _, err := reEngine(t, e).Apply(context.Background()); err != nil {
		t.Errorf("apply after unlock: %v", err)
	}
}

// A reboot that could not start (dpkg busy) is asked for again by the next
// apply; the recipe never carries on past a reboot step without it.
func TestRebootRetriedAfterDpkgWait(t *testing.T) {
	ctx := context.Background()
	root := fixture(t)
	node := newFakeNode(t, root)
	e := newTestEngine(t, root, node, testConfig())
	e.Locks = &countingProbe{heldFor: 1 << 30}
	e.LockWait = 20 * time.Millisecond
	if _, err := e.Apply(ctx); err == nil || !strings.Contains(err.Error(), "resume with:") {
		t.Fatalf("apply with dpkg busy: %v", err)
	}
	if slices.Contains(node.lines(), "systemctl reboot") {
		t.Fatal("rebooted while dpkg was busy")
	}
	e2 := reEngine(t, e)
	e2.Locks = noLocks{}
	node.calls = nil
	out, err := e2.Apply(ctx)
	if err != nil || out != Rebooting {
		t.Fatalf("retry = %v, %v", out, err)
	}
	l := node.lines()
	if l[len(l)-1] != "systemctl reboot" || slices.ContainsFunc(l, func(s string) bool { return strings.Contains(s, "proxmox-ve") }) {
		t.Errorf("retry ran %q", l)
	}
}

// TestIdentityOnNewInstance: on the instance that made the secrets,
// Identity changes nothing; on a new instance id (an image launched again)
// it rewrites host name and hosts, makes a new root password, token and
// node certificate, and runs nothing of any other step.
func TestIdentityOnNewInstance(t *testing.T) {
	ctx := context.Background()
	root := fixture(t)
	node := newFakeNode(t, root)
	cfg := testConfig()
	must(t, root.WriteFile("/usr/sbin/pveum", []byte("#!/bin/sh\n"), 0o755))
	must(t, root.WriteFile("/usr/bin/pvecm", []byte("#!/bin/sh\n"), 0o755))
	must(t, root.WriteFile(AccessSetupPath, []byte("#!/bin/sh\n"), 0o755))
	e := newTestEngine(t, root, node, cfg)
	must(t, e.load())
	e.Steps = slices.DeleteFunc(Recipe(), func(s Step) bool { return !slices.Contains(IdentitySteps, s.ID) })
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	e.Steps = Recipe()
	pw := func() string { b, _ := os.ReadFile(root.Path(DefaultRootPasswordFile)); return string(b) }
	first := pw()

	node.calls = nil
	id, changed, err := reEngine(t, e).Identity(ctx)
	if err != nil || changed || len(node.calls) != 0 {
		t.Fatalf("same instance %s: changed %v, err %v, ran %q", id, changed, err, node.lines())
	}

	must(t, root.WriteFile(instanceID, []byte("i-0aaaaaaaaaaaaaaa1\n"), 0o644))
	must(t, root.WriteFile(HostnamePath, []byte("ip-172-31-5-17\n"), 0o644)) // what EC2 gave the new instance
	e.Env.Random = bytes.NewReader(bytes.Repeat([]byte{0x44}, 64))
	id, changed, err = reEngine(t, e).Identity(ctx)
	if err != nil || !changed || id != "i-0aaaaaaaaaaaaaaa1" {
		t.Fatalf("new instance: id %s changed %v err %v", id, changed, err)
	}
	if b, _ := os.ReadFile(root.Path(HostnamePath)); string(b) != cfg.Hostname+"\n" {
		t.Errorf("hostname %q", b)
	}
	if pw() == first {
		t.Error("root password not regenerated")
	}
	for _, l := range node.lines() {
		ok := false
		for _, p := range []string{"hostname ", "openssl passwd", "chpasswd", AccessSetupPath, "pvecm updatecerts"} {
			ok = ok || strings.HasPrefix(l, p)
		}
		if !ok {
			t.Errorf("identity ran %q, which belongs to no identity step", l)
		}
	}
	if !slices.Contains(node.lines(), "pvecm updatecerts --force") {
		t.Errorf("node certificate not renewed: %q", node.lines())
	}
	st, err := LoadState(root)
	must(t, err)
	if st.SecretsInstance != "i-0aaaaaaaaaaaaaaa1" {
		t.Errorf("state records instance %q", st.SecretsInstance)
	}
}
