package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// needNodeClient finds node and the official MCP TypeScript SDK in
// mcpclient/node_modules, installing it with `npm ci` from the committed
// lock file when it is missing. Under CI a missing piece is a failure.
func needNodeClient(t *testing.T) string {
	t.Helper()
	miss := func(format string, a ...any) {
		t.Helper()
		if testkit.InCI() {
			t.Fatalf(format+" (CI is set, so this is a failure; .ci/install-deps installs it)", a...)
		}
		t.Skipf("SKIPPED: "+format+" (.ci/install-deps installs it)", a...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		miss("node is not installed")
	}
	dir, _ := filepath.Abs("mcpclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		npm, err := exec.LookPath("npm")
		if err != nil {
			miss("npm is not installed")
		}
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			miss("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return node
}

// playgroundProc is a running `pve-inspect-demo --stay`.
type playgroundProc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // everything it printed
	info map[string]string
	done chan error
	// restarted receives a value each time it says its daemon restarted
	// (after a SIGHUP).
	restarted chan struct{}
}

// startPlayground runs the binary (with more flags in args) and waits for
// "playground ready".
func startPlayground(t *testing.T, bin string, args ...string) *playgroundProc {
	t.Helper()
	p := &playgroundProc{info: map[string]string{}, done: make(chan error, 1), restarted: make(chan struct{}, 1)}
	p.cmd = exec.Command(filepath.Join(bin, "pve-inspect-demo"), append([]string{"--stay", "--bin", bin, "--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			line := sc.Text()
			p.out.WriteString(line + "\n")
			if k, v, ok := strings.Cut(line, " = "); ok && !strings.HasPrefix(line, " ") && !said {
				p.info[k] = v
			}
			if rest, ok := strings.CutPrefix(line, "  export PVE_INSPECT_"); ok && !said {
				p.info["inspect_export"] = "PVE_INSPECT_" + rest
			}
			if line == "pve-inspectd restarted" {
				select {
				case p.restarted <- struct{}{}:
				default:
				}
			}
			if line == "playground ready" && !said {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(2 * time.Minute):
				_ = p.cmd.Process.Kill()
			}
		}
	})
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("playground exited before ready:\n%s", p.out.String())
		}
	case <-time.After(5 * time.Minute):
		t.Fatalf("playground not ready after 5 minutes:\n%s", p.out.String())
	}
	for _, k := range []string{"bed", "config", "socket", "api", "ca", "owner", "token", "read_token", "admin_token", "mcp_url", "mcp_stdio", "env_file", "builds", "mirror"} {
		if p.info[k] == "" {
			t.Fatalf("playground did not print %s:\n%s", k, p.out.String())
		}
	}
	return p
}

// daemonLog returns the last lines of the playground daemon's log that
// contain one of words, for a failure's message.
func (p *playgroundProc) daemonLog(t *testing.T, words ...string) string {
	t.Helper()
	// the daemon logs next to its configuration (startDaemon)
	if p.info["config"] == "" {
		return "(no config path printed)"
	}
	path := filepath.Join(filepath.Dir(p.info["config"]), "pve-inspectd.log")
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				keep = append(keep, l)
				break
			}
		}
	}
	return lastLines(strings.Join(keep, "\n"), 60)
}

// stop sends SIGTERM and waits for a clean exit.
func (p *playgroundProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("playground exited with %v:\n%s", err, p.out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("playground did not stop within 2 minutes of SIGTERM")
	}
}

// TestPlayground starts `pve-inspect-demo --stay`, drives a sandbox through
// the printed endpoints (the API over TLS with the printed token; the MCP
// server over stdio and streamable HTTP with the official TypeScript SDK),
// stops it with SIGTERM and checks that nothing is left behind.
func TestPlayground(t *testing.T) {
	testkit.RequireRoot(t)
	node := needNodeClient(t)
	bin := buildBins(t)
	p := startPlayground(t, bin)
	in := p.info
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// The Inspect provider's export line (the README tells users to run
	// it) names the listener, the examples' token and the listener's CA.
	want := "PVE_INSPECT_URL=" + in["api"] + " PVE_INSPECT_TOKEN=" + in["token"] + " PVE_INSPECT_CA_FILE=" + in["ca"]
	if in["inspect_export"] != want {
		t.Errorf("the Inspect export line says %q, want %q", in["inspect_export"], want)
	}

	// The API over TLS, as the printed curl lines do.
	pem, err := os.ReadFile(in["ca"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the printed CA file")
	}
	u, err := url.Parse(in["api"])
	if err != nil {
		t.Fatal(err)
	}
	tlsc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	c := client.NewTLS(u.Host, tlsc, client.WithToken(in["token"]))
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create through %s: %v", in["api"], err)
	}
	if sb.Owner != in["owner"] || in["owner"] != playgroundOwner {
		t.Errorf("the examples' token created a sandbox of owner %q, want %q (printed %q)", sb.Owner, playgroundOwner, in["owner"])
	}
	res, err := c.Exec(ctx, sb.ID, sb.VMs[0].Name, apitype.ExecRequest{Argv: []string{"uname", "-s"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "Linux\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	checkTokensBound(t, ctx, c, client.NewTLS(u.Host, tlsc, client.WithToken(in["admin_token"])), sb.ID)
	checkRecordAcrossRestart(t, ctx, p, c)
	checkOpenDNSRecorded(t, ctx, c)
	checkNoEnvFile(t, ctx, in["mcp_url"], tlsc, in["admin_token"])
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	ro := client.NewTLS(u.Host, tlsc, client.WithToken(in["read_token"]))
	if _, err := ro.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}); !client.IsProblem(err, apitype.ProblemForbidden) {
		t.Errorf("read token create: %v, want forbidden", err)
	}

	// The official TypeScript SDK over both transports.
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = "mcpclient"
	cmd.Env = append(os.Environ(), "PVEI_STDIO="+in["mcp_stdio"], "PVEI_URL="+in["mcp_url"], "PVEI_TOKEN="+in["token"],
		"PVEI_READ_TOKEN="+in["read_token"], "NODE_EXTRA_CA_CERTS="+in["ca"], "PVEI_SECRET="+playgroundKey)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\n%s\nthe daemon's log, warnings and the check:\n%s", err, lastLines(stderr.String(), 40), p.daemonLog(t, "level=WARN", "level=ERROR", "containment", "check"))
	}
	t.Logf("TypeScript SDK client: %s", out)
	if checkClientResult(t, out); t.Failed() {
		t.Logf("the daemon's log, warnings and the check:\n%s", p.daemonLog(t, "level=WARN", "level=ERROR", "containment", "check"))
	}

	if l, err := client.NewTLS(u.Host, tlsc, client.WithToken(in["admin_token"])).List(ctx); err != nil || len(l) != 0 {
		t.Errorf("sandboxes left: %v %v", l, err)
	}
	p.stop(t)
	if !strings.Contains(p.out.String(), "playground down: every namespace") {
		t.Errorf("no clean teardown said:\n%s", p.out.String())
	}
	assertGone(t, in)
}

// checkRecordAcrossRestart: the egress record of a sandbox that lives
// through a restart of the daemon (SIGHUP to the playground: the real
// pve-inspectd stops on SIGTERM, as systemd stops it, and starts again on
// the same state directory) is the same record after it, and the guest's
// next question goes on from where it was (issue 39).
func checkRecordAcrossRestart(t *testing.T, ctx context.Context, p *playgroundProc, c *client.Client) {
	t.Helper()
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}},
		Egress: &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{testvm.InternetName}}})
	if err != nil {
		t.Fatalf("create with an allowlist: %v", err)
	}
	defer func() {
		if err := c.Delete(ctx, sb.ID); err != nil {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
	}()
	resolve := func(name string) {
		t.Helper()
		// getent's answer does not matter (a refused name fails it); the
		// daemon's resolver has seen the question when it returns
		if _, err := c.Exec(ctx, sb.ID, sb.VMs[0].Name, apitype.ExecRequest{Argv: []string{"getent", "hosts", name}, TimeoutSeconds: 20}); err != nil {
			t.Fatalf("exec getent hosts %s: %v", name, err)
		}
	}
	dnsRecords := func() apitype.EgressLog {
		t.Helper()
		l, err := c.EgressLog(ctx, sb.ID, apitype.EgressLogQuery{Type: "dns"})
		if err != nil {
			t.Fatalf("egress log of %s: %v", sb.ID, err)
		}
		return l
	}
	verdictOf := func(l apitype.EgressLog, name string) string {
		for _, r := range l.Records {
			if r.Name == name {
				return r.Verdict
			}
		}
		return ""
	}
	resolve(testvm.InternetName)
	resolve("refused.example.org")
	before := dnsRecords()
	if verdictOf(before, testvm.InternetName) != "answered" || verdictOf(before, "refused.example.org") != "refused" {
		t.Fatalf("the record before the restart lacks the two questions: %+v", before)
	}

	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.restarted:
	case err := <-p.done:
		t.Fatalf("the playground exited on SIGHUP: %v\n%s", err, p.out.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("the playground did not say its daemon restarted within 3 minutes of SIGHUP")
	}

	after := dnsRecords()
	if len(after.Records) != len(before.Records) || after.Next != before.Next || after.Dropped != before.Dropped {
		t.Fatalf("after the restart the record has %d records (next %d, dropped %d), before %d (next %d, dropped %d): %+v",
			len(after.Records), after.Next, after.Dropped, len(before.Records), before.Next, before.Dropped, after)
	}
	for i, r := range after.Records {
		b := before.Records[i]
		if r.Seq != b.Seq || !r.Time.Equal(b.Time) || r.Name != b.Name || r.Verdict != b.Verdict || r.VM != b.VM || r.Source != b.Source {
			t.Errorf("record %d after the restart %+v, before %+v", i, r, b)
		}
	}
	resolve("after.example.org")
	more := dnsRecords()
	if verdictOf(more, "after.example.org") != "refused" || more.Next <= before.Next {
		t.Errorf("the question after the restart: %+v (next before it %d)", more, before.Next)
	}
}

// checkOpenDNSRecorded: a guest of an open sandbox on the real daemon
// resolves a name as a guest does (its resolver is the gateway DHCP gave
// it, the zone's dnsmasq); the answer is the dnsmasq's, and the question
// is in the sandbox's record by name with that answer (issue 39: "each
// DNS question ... in open as well").
func checkOpenDNSRecorded(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}},
		Egress: &apitype.EgressPolicy{Mode: "open"}})
	if err != nil {
		t.Fatalf("create an open sandbox: %v", err)
	}
	defer func() {
		if err := c.Delete(ctx, sb.ID); err != nil {
			t.Errorf("delete %s: %v", sb.ID, err)
		}
	}()
	res, err := c.Exec(ctx, sb.ID, sb.VMs[0].Name, apitype.ExecRequest{Argv: []string{"getent", "ahostsv4", testvm.InternetName}, TimeoutSeconds: 20})
	if err != nil || res.ExitCode != 0 || !strings.Contains(string(res.Stdout), testvm.InternetAddr) {
		t.Fatalf("getent ahostsv4 %s in an open sandbox: %+v, %v", testvm.InternetName, res, err)
	}
	l, err := c.EgressLog(ctx, sb.ID, apitype.EgressLogQuery{Type: "dns"})
	if err != nil {
		t.Fatalf("egress log of %s: %v", sb.ID, err)
	}
	for _, r := range l.Records {
		if r.Name == testvm.InternetName && r.QType == "A" && r.Verdict == "answered" && slices.Contains(r.Answers, testvm.InternetAddr) && r.VM == sb.VMs[0].Name {
			return
		}
	}
	t.Errorf("the open sandbox's record has no answered A question for %s from %s: %+v", testvm.InternetName, sb.VMs[0].Name, l)
}

// checkTokensBound: the examples' token is bound to the playground's
// owner (a sandbox admin_token makes for no owner is invisible to it and
// out of its reach), and admin_token, bound to no owner, sees both.
func checkTokensBound(t *testing.T, ctx context.Context, user, admin *client.Client, mine string) {
	t.Helper()
	other, err := admin.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("admin_token create: %v", err)
	}
	defer func() {
		if err := admin.Delete(ctx, other.ID); err != nil {
			t.Errorf("admin_token delete %s: %v", other.ID, err)
		}
	}()
	ids := func(c *client.Client) []string {
		l, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range l {
			out = append(out, s.ID)
		}
		slices.Sort(out)
		return out
	}
	if got := ids(user); !slices.Equal(got, []string{mine}) {
		t.Errorf("the examples' token lists %v, want only its own %s (it is bound to no owner)", got, mine)
	}
	if err := user.Delete(ctx, other.ID); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("the examples' token deleting another owner's sandbox: %v, want not-found", err)
	}
	if got, want := ids(admin), slices.Sorted(slices.Values([]string{mine, other.ID})); !slices.Equal(got, want) {
		t.Errorf("admin_token lists %v, want %v", got, want)
	}
}

// checkNoEnvFile: a sandbox made through MCP over HTTP with tok (a token
// [mcp] env_file_owners does not name) has no /etc/pve-inspect/env.
func checkNoEnvFile(t *testing.T, ctx context.Context, url string, tlsc *tls.Config, tok string) {
	t.Helper()
	hc := &http.Client{Transport: testkit.Bearer{Token: tok, RT: &http.Transport{TLSClientConfig: tlsc}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("mcp over http with admin_token: %v", err)
	}
	defer cs.Close()
	call := func(name string, args map[string]any) map[string]any {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", name, err, res)
		}
		m, _ := res.StructuredContent.(map[string]any)
		return m
	}
	id := call(mcpserver.ToolCreate, map[string]any{})["id"]
	out := call(mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"cat", apitype.GuestEnvPath}})
	if out["exit_code"] == float64(0) || strings.Contains(fmt.Sprint(out["stdout"]), playgroundKey) {
		t.Errorf("admin_token's MCP sandbox holds the env file: %v", out)
	}
	call(mcpserver.ToolDestroy, map[string]any{"id": id})
}

// clientResult is what client.mjs prints.
type clientResult struct {
	Stdio, HTTP transportResult
	Readonly    struct {
		Tools  []string
		Create struct {
			Refused bool
			Error   string
		}
	}
	Unauthenticated struct{ Refused bool }
}

type transportResult struct {
	Tools []string
	ID    string
	Uname string
	File  struct {
		Written, Read int
		Equal         bool
	}
	Check struct {
		Pass   bool
		Rows   int
		Failed []string // the failing rows, said when the check fails
	}
	Progress struct {
		Notifications int
		Stdout        string
	}
	Cancel struct {
		Aborted bool
		Left    int
	}
	Env struct {
		Stat  string
		Shown bool
	}
	Egress struct {
		Sandbox, Records, Next bool
	}
	Destroyed bool
}

func checkClientResult(t *testing.T, out []byte) {
	t.Helper()
	var r clientResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("client output: %v\n%s", err, out)
	}
	for name, tr := range map[string]transportResult{"stdio": r.Stdio, "http": r.HTTP} {
		if len(tr.Tools) != 12 || !slices.Contains(tr.Tools, "sandbox_create") || !slices.Contains(tr.Tools, "sandbox_egress_log") {
			t.Errorf("%s: tools %v", name, tr.Tools)
		}
		if tr.ID == "" || !strings.HasPrefix(tr.Uname, "Linux ") || !tr.Destroyed {
			t.Errorf("%s: id %q uname %q destroyed %v", name, tr.ID, tr.Uname, tr.Destroyed)
		}
		if tr.File.Written != 1<<20 || tr.File.Read != 1<<20 || !tr.File.Equal {
			t.Errorf("%s: 1 MiB round trip %+v", name, tr.File)
		}
		if !tr.Check.Pass || tr.Check.Rows == 0 {
			t.Errorf("%s: check %+v", name, tr.Check)
		}
		if tr.Progress.Notifications < 1 || tr.Progress.Stdout != "line 1\nline 2\nline 3\n" {
			t.Errorf("%s: progress %+v", name, tr.Progress)
		}
		if tr.Env.Stat != "600 root\n1\n" || tr.Env.Shown {
			t.Errorf("%s: secrets file %+v: want mode 600, owner root, one line, shown by no tool", name, tr.Env)
		}
		if !tr.Egress.Sandbox || !tr.Egress.Records || !tr.Egress.Next {
			t.Errorf("%s: sandbox_egress_log %+v: want the sandbox's page", name, tr.Egress)
		}
		if !tr.Cancel.Aborted || tr.Cancel.Left != 0 {
			t.Errorf("%s: cancellation %+v: the command must be gone from the guest", name, tr.Cancel)
		}
	}
	if !slices.Equal(r.Readonly.Tools, []string{"sandbox_egress_log", "sandbox_get", "sandbox_list"}) || !r.Readonly.Create.Refused {
		t.Errorf("read-only token: %+v", r.Readonly)
	}
	if !r.Unauthenticated.Refused {
		t.Error("a client without a token was served")
	}
}

// assertGone checks that the playground left no namespace, directory,
// socket or listener behind.
func assertGone(t *testing.T, in map[string]string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, in["bed"]+"-") {
			t.Errorf("namespace left: %s", l)
		}
	}
	for _, p := range []string{in["socket"], filepath.Dir(filepath.Dir(in["config"]))} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
	u, _ := url.Parse(in["api"])
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections", u.Host)
	}
}
