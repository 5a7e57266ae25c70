package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// needPython finds the Python side's virtual environment (python/.venv),
// creating it with python/install.sh (PyPI, every version pinned by
// python/constraints.txt) when it is missing. Under CI a missing piece is a
// failure.
func needPython(t *testing.T) string {
	t.Helper()
	miss := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf(format+" (CI is set, so this is a failure; .ci/install-deps installs it)", a...)
		}
		t.Skipf("SKIPPED: "+format+" (.ci/install-deps installs it)", a...)
	}
	dir, _ := filepath.Abs("../../python")
	pytest := filepath.Join(dir, ".venv", "bin", "pytest")
	if _, err := os.Stat(pytest); err != nil {
		if _, err := exec.LookPath("python3"); err != nil {
			miss("python3 is not installed")
		}
		cmd := exec.Command(filepath.Join(dir, "install.sh"))
		if out, err := cmd.CombinedOutput(); err != nil {
			miss("python/install.sh: %v\n%s", err, out)
		}
	}
	return dir
}

// createToken makes a token of scope on the playground's daemon (the
// printed stdio command with "mcp" swapped for "token create").
func createToken(t *testing.T, in map[string]string, name, scope string) string {
	t.Helper()
	var argv []string
	if err := json.Unmarshal([]byte(in["mcp_stdio"]), &argv); err != nil || len(argv) < 2 || argv[len(argv)-1] != "mcp" {
		t.Fatalf("mcp_stdio %q: %v", in["mcp_stdio"], err)
	}
	argv = append(argv[:len(argv)-1], "token", "create", name, "--scope", scope)
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return strings.TrimSpace(string(out))
}

// buildBins builds the daemon, the probe and the demo into a temporary
// directory.
func buildBins(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	for _, pkg := range []string{"../pve-inspectd", "../pve-inspect-probe", "."} {
		cmd := exec.Command("go", "build", "-o", bin+"/", pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return bin
}

// suiteNS is the network namespace the third-party suites (Inspect's
// self_check and evals, schemathesis) run in: loopback only, so nothing they
// do can reach the machine's gateway or a metadata address. Each daemon's
// API is relayed into it on the same loopback address and port, so URLs and
// TLS names stay as the playground printed them.
type suiteNS struct{ ns *testkit.NetNS }

func newSuiteNS(t *testing.T) *suiteNS {
	t.Helper()
	return &suiteNS{ns: testkit.NewNetNS(t, "pypy")}
}

// relay listens on api's loopback host:port inside the namespace and
// forwards each connection to api on the machine's loopback; it stops when
// the test's cleanup closes the listener.
func (s *suiteNS) relay(t *testing.T, api string) {
	t.Helper()
	u, err := url.Parse(api)
	if err != nil || u.Host == "" {
		t.Fatalf("playground API %q: not a URL with a host (%v)", api, err)
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		t.Fatalf("playground API %q: want a loopback address", api)
	}
	l := s.ns.Listen(t, "tcp", u.Host)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // the listener closed at cleanup
			}
			go splice(c, u.Host)
		}
	}()
}

// splice copies between c and a new connection to addr until either side ends.
func splice(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// runPytest runs the Python suite (args select tests) with env inside the
// suite's namespace and fails unless it passed.
func runPytest(t *testing.T, ctx context.Context, s *suiteNS, dir string, env []string, args ...string) {
	t.Helper()
	cmd := s.ns.Command(ctx, append([]string{filepath.Join(dir, ".venv", "bin", "pytest"), "-q", "-p", "no:cacheprovider", "-rxs"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{
		"CI=true", // a missing bed is a failure inside pytest too
		"INSPECT_LOG_DIR=" + t.TempDir(), "INSPECT_DISPLAY=none", "HOME=" + t.TempDir()}, env...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	// The whole output goes to a file (while the test runs) and, on a
	// failure, to the log: a finding (a schemathesis report, a traceback)
	// is reproducible only from all of it, not from the last lines.
	logFile := filepath.Join(t.TempDir(), "pytest.log")
	if werr := os.WriteFile(logFile, out.Bytes(), 0o644); werr != nil {
		t.Errorf("write %s: %v", logFile, werr)
	}
	failed := err != nil || !strings.Contains(out.String(), " passed") || strings.Contains(out.String(), " failed")
	if failed {
		t.Logf("pytest (all of its output, also in %s):\n%s", logFile, out.String())
	} else {
		t.Logf("pytest (the last lines; all in %s):\n%s", logFile, lastLines(out.String(), 60))
	}
	if err != nil {
		t.Fatalf("pytest against the playground: %v", err)
	}
	if failed {
		t.Fatalf("pytest summary: %s", lastLines(out.String(), 3))
	}
}

// TestInspectProvider starts the playground and runs the Python package's
// pytest suite against it (the real inspect-ai: Inspect's self_check on a
// pve_inspect sandbox, inspect_ai.eval runs of the example task in both
// config shapes, `inspect sandbox cleanup pve_inspect`), the daemon reached
// as an Inspect user would, over TLS with a token; then it stops the
// playground and checks that nothing is left.
func TestInspectProvider(t *testing.T) {
	testkit.RequireRoot(t)
	dir := needPython(t)
	bin := buildBins(t)
	p := startPlayground(t, bin)
	in := p.info
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sns := newSuiteNS(t)
	sns.relay(t, in["api"])
	// admin_token, bound to no owner, on purpose: the token that sees every
	// sandbox of the node is the one the CLI cleanup must not let loose on
	// other users' sandboxes (test_eval.py).
	// PVE_INSPECT_PYTEST_K selects tests (pytest -k) when a developer
	// runs one part of the suite; CI runs it whole.
	var sel []string
	if k := os.Getenv("PVE_INSPECT_PYTEST_K"); k != "" {
		sel = []string{"-k", k}
	}
	runPytest(t, ctx, sns, dir, []string{
		"PVE_INSPECT_URL=" + in["api"], "PVE_INSPECT_TOKEN=" + in["admin_token"], "PVE_INSPECT_CA_FILE=" + in["ca"],
		"PVE_INSPECT_READ_TOKEN=" + in["read_token"],
		"PVE_INSPECT_EXEC_TOKEN=" + createToken(t, in, "inspect-exec", "exec"),
		"PVE_INSPECT_BIN_DIR=" + bin, // connection()'s command runs pve-inspectd
	}, sel...)
	p.stop(t)
	assertGone(t, in)
}

// TestInspectBuiltInBuild starts the playground, whose node builds the
// built-ins it prints from the mirror on its uplink, and runs two pytest
// files against it, each a subtest:
//
//   - python/tests/test_builtin_build.py: for ubuntu24.04 (an OVA),
//     debian13 and kali2025.4 (a .tar.xz the node unpacks), a real
//     inspect_ai.eval of the reference's config of one VM of the built-in,
//     whose preflight has the node build the template (with admin_token:
//     builds are refused to owner-bound tokens), scores; a second eval
//     reuses the template without a build.
//   - python/tests/test_ctf4.py: the reference's CTF task (ctf4.py: a
//     kali2025.4 agent and an agentless victim imported from an OVA on ide
//     with an e1000 NIC, one vnet with a DHCP range) with the mock model
//     playing the agent; the victim's sample scores 1, a sample looking
//     for an address of no VM 0, and the Kali template the first file
//     built is reused (run alone, the eval builds it).
func TestInspectBuiltInBuild(t *testing.T) {
	testkit.RequireRoot(t)
	dir := needPython(t)
	bin := buildBins(t)
	p := startPlayground(t, bin)
	in := p.info
	for _, b := range []string{"debian13", "ubuntu24.04", "kali2025.4"} {
		if !slices.Contains(strings.Split(in["builds"], ","), b) {
			t.Fatalf("the playground builds %q, not %s", in["builds"], b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sns := newSuiteNS(t)
	sns.relay(t, in["api"])
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's log of builds:\n%s", p.daemonLog(t, "template", "build"))
		}
	})
	env := []string{"PVE_INSPECT_URL=" + in["api"], "PVE_INSPECT_TOKEN=" + in["admin_token"], "PVE_INSPECT_CA_FILE=" + in["ca"]}
	// In this order: the first asserts that no built-in is there yet.
	for _, file := range []string{"test_builtin_build.py", "test_ctf4.py"} {
		t.Run(strings.TrimSuffix(file, ".py"), func(t *testing.T) {
			runPytest(t, ctx, sns, dir, env, "tests/"+file)
		})
	}
	p.stop(t)
	assertGone(t, in)
}

// TestInspectProviderTwoNodes starts two playgrounds (two nodes, each its
// daemon, token and CA) and runs python/tests/test_nodes.py: 8 samples over
// both nodes, the second stopped mid-eval (the test sends SIGTERM to its
// playground), the rest finishing on the first.
func TestInspectProviderTwoNodes(t *testing.T) {
	testkit.RequireRoot(t)
	dir := needPython(t)
	bin := buildBins(t)
	p1 := startPlayground(t, bin)
	p2 := startPlayground(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	sns := newSuiteNS(t)
	sns.relay(t, p1.info["api"])
	sns.relay(t, p2.info["api"])
	runPytest(t, ctx, sns, dir, []string{
		"PVE_INSPECT_URL=" + p1.info["api"] + "," + p2.info["api"],
		"PVE_INSPECT_TOKEN=" + p1.info["admin_token"] + "," + p2.info["admin_token"],
		"PVE_INSPECT_CA_FILE=" + p1.info["ca"] + "," + p2.info["ca"],
		"PVE_INSPECT_STOP_PID=" + strconv.Itoa(p2.cmd.Process.Pid),
	}, "tests/test_nodes.py")
	select {
	case err := <-p2.done:
		if err != nil {
			t.Errorf("second playground, stopped mid-eval, exited with %v:\n%s", err, p2.out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the second playground did not stop after the test's SIGTERM")
	}
	p1.stop(t)
	assertGone(t, p1.info)
	assertGone(t, p2.info)
}
