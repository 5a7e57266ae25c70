package main

import (
	"bytes"
	"context"
	"fmt"
	"go/build"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cloud/ec2"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/provision"
)

// fixtureDeps answer like a fresh Debian 13 machine: nothing of Proxmox
// installed, the Debian kernel present.
func fixtureDeps(rec *provision.RecordingRunner) *deps {
	d := defaultDeps()
	d.runner = rec
	d.addrs = provision.StaticAddr{Interface: "ens5", Prefix: netip.MustParsePrefix("172.31.5.17/20")}
	d.executable = func() (string, error) { return "/usr/local/bin/pve-bootstrap", nil }
	d.stderr = io.Discard
	return d
}

func freshMachine() *provision.RecordingRunner {
	return &provision.RecordingRunner{Replies: []*provision.Reply{
		{Prefix: "dpkg-query -W -f=${Package}\t${db:Status-Status}\n linux-image-* os-prober", Stdout: "linux-image-amd64\tinstalled\nlinux-image-6.12.48+deb13-amd64\tinstalled\n", Code: 1},
		{Prefix: "dpkg-query", Code: 1},
		{Prefix: "pvesh", Code: 127},
	}}
}

func runCmd(t *testing.T, d *deps, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd(d)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	// A verb that hangs (a libvirt call without a deadline) fails the test
	// with what it printed instead of running into go test's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if ctx.Err() != nil {
		return out.String(), fmt.Errorf("%v (the verb ran past its 15 minutes: %w)", err, ctx.Err())
	}
	return out.String(), err
}

func fixtureRoot(t *testing.T) string {
	// A copy, so nothing a test does can touch the checked-in tree.
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS("testdata/fixture")); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestNodePlanGolden(t *testing.T) {
	root := fixtureRoot(t)
	before := tree(t, root)
	rec := freshMachine()
	out, err := runCmd(t, fixtureDeps(rec), "node", "plan", "--root", root, "--config", "/etc/pve-bootstrap/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "plan.golden", []byte(out))
	jout, err := runCmd(t, fixtureDeps(freshMachine()), "node", "plan", "--json", "--root", root, "--config", "/etc/pve-bootstrap/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "plan.json.golden", []byte(jout))
	if tree(t, root) != before {
		t.Error("plan changed the fixture")
	}
	for _, l := range rec.Lines() {
		if !strings.HasPrefix(l, "dpkg-query") && !strings.HasPrefix(l, "pvesh get") {
			t.Errorf("plan ran %q", l)
		}
	}
}

// unskippedRoot is the fixture with a config that skips no step.
func unskippedRoot(t *testing.T) string {
	t.Helper()
	root := fixtureRoot(t)
	p := filepath.Join(root, "etc/pve-bootstrap/config.toml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, bytes.Replace(b, []byte(`skip = ["storage-content"]`), nil, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestNodePlanWithoutProxmoxTools runs `node plan` on this machine's real
// commands with a PATH that has the tools of a fresh Debian 13 and no
// Proxmox ones: every step is listed, the check that needs pvesh says it
// follows proxmox-ve, and plan exits 0.
func TestNodePlanWithoutProxmoxTools(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"dpkg-query", "systemctl"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			if testkit.InCI() {
				t.Fatalf("%s missing (CI is set, so this is a failure): %v", tool, err)
			}
			t.Skipf("SKIPPED: %s missing: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	d := fixtureDeps(nil)
	d.runner = provision.ExecRunner{}
	root := unskippedRoot(t)
	out, err := runCmd(t, d, "node", "plan", "--root", root, "--config", "/etc/pve-bootstrap/config.toml")
	if err != nil {
		t.Fatalf("plan failed: %v\n%s", err, out)
	}
	for _, id := range provision.StepIDs() {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s`).MatchString(out) {
			t.Errorf("step %s not listed:\n%s", id, out)
		}
	}
	if !regexp.MustCompile(`(?m)^storage-content\s+apply\s.*\(after proxmox-ve: will apply\)$`).MatchString(out) {
		t.Errorf("storage-content does not say it follows proxmox-ve:\n%s", out)
	}
}

// TestNodePlanMissingToolFake: the same through the recording runner,
// with --json carrying the note.
func TestNodePlanMissingToolFake(t *testing.T) {
	rec := &provision.RecordingRunner{Replies: []*provision.Reply{
		{Prefix: "dpkg-query", Code: 1},
		{Prefix: "pvesh", Missing: true},
	}}
	out, err := runCmd(t, fixtureDeps(rec), "node", "plan", "--json", "--root", unskippedRoot(t), "--config", "/etc/pve-bootstrap/config.toml")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, `"note": "after proxmox-ve: will apply"`) {
		t.Errorf("json plan lacks the note:\n%s", out)
	}
}

func TestNodeStatusFresh(t *testing.T) {
	root := fixtureRoot(t)
	out, err := runCmd(t, fixtureDeps(freshMachine()), "node", "status", "--root", root, "--config", "/etc/pve-bootstrap/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "hostname               pending") || !strings.Contains(out, "storage-content        skipped") {
		t.Errorf("status:\n%s", out)
	}
}

func TestNodeBadConfigNamesKey(t *testing.T) {
	root := fixtureRoot(t)
	p := filepath.Join(root, "etc/pve-bootstrap/config.toml")
	b, _ := os.ReadFile(p)
	os.WriteFile(p, bytes.Replace(b, []byte(`hostname = "pve1"`), []byte(`hostname = "PVE 1"`), 1), 0o600)
	_, err := runCmd(t, fixtureDeps(freshMachine()), "node", "plan", "--root", root, "--config", "/etc/pve-bootstrap/config.toml")
	if err == nil || !strings.Contains(err.Error(), `config key "hostname"`) {
		t.Errorf("err = %v", err)
	}
}

func TestEC2UserdataCommand(t *testing.T) {
	root := fixtureRoot(t)
	cfg := filepath.Join(root, "etc/pve-bootstrap/config.toml")
	sha := strings.Repeat("ab", 32)
	out, err := runCmd(t, fixtureDeps(freshMachine()), "ec2", "userdata", "--node-config", cfg,
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", sha)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := ec2.Decode(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`hostname = "pve1"`, sha, "pve-bootstrap node apply --config /etc/pve-bootstrap/config.toml"} {
		if !bytes.Contains(doc, []byte(want)) {
			t.Errorf("user-data lacks %q", want)
		}
	}
	if _, err := runCmd(t, fixtureDeps(freshMachine()), "ec2", "userdata", "--node-config", cfg,
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", "nothex"); err == nil {
		t.Error("bad sha accepted")
	}
}

func tree(t *testing.T, root string) string {
	var b strings.Builder
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			c, _ := os.ReadFile(p)
			b.WriteString(p + " " + fi.Mode().String() + " " + string(c) + "\n")
		}
		return nil
	})
	return b.String()
}

// TestImportBoundaries keeps pve-bootstrap away from the daemon's packages.
func TestImportBoundaries(t *testing.T) {
	forbidden := []string{"firewall", "lockdown", "sandboxapi", "testvm"}
	seen := map[string]bool{}
	var walk func(path string)
	walk = func(path string) {
		if seen[path] {
			return
		}
		seen[path] = true
		const mod = "github.com/pve-inspect/pve-inspect/"
		for _, f := range forbidden {
			if path == mod+f || strings.HasPrefix(path, mod+f+"/") {
				t.Errorf("pve-bootstrap imports %s", path)
			}
		}
		if !strings.HasPrefix(path, mod) && path != "." {
			return
		}
		pkg, err := build.Default.Import(path, ".", 0)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		for _, imp := range pkg.Imports {
			walk(imp)
		}
	}
	walk(".")
}
