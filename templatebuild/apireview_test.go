package templatebuild_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// hostileCloudInit is a guest whose agent answers `cloud-init status
// --wait` with an error reply carrying terminal escapes (the agent's desc
// is the guest's text).
type hostileCloudInit struct{ templatebuild.Agent }

func (h hostileCloudInit) Exec(ctx context.Context, vmid int, argv []string, timeout time.Duration) (templatebuild.AgentResult, error) {
	if argv[0] == "cloud-init" {
		return templatebuild.AgentResult{}, &qga.AgentError{Command: "guest-exec", Class: "GenericError\x1b[31m",
			Desc: "\x1b]0;pwned\x07\x1b[2J\x1b[Hfake: build done\r\x9b1m"}
	}
	return h.Agent.Exec(ctx, vmid, argv, timeout)
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return r != '\n' && r != '\t' && unicode.IsControl(r) }) >= 0
}

// TestBuildFailureTextSanitized: the guest agent's error text (its
// untrusted desc) reaches a failed build's Error and its
// template.build.failed event without its control characters, as the
// progress lines do.
func TestBuildFailureTextSanitized(t *testing.T) {
	n := newServiceNode(t)
	n.agent.Agent = hostileCloudInit{n.agent.Agent}
	close(n.agent.gate)
	if _, err := n.svc.Start(context.Background(), n.fromURL("tpl-hostile")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	var st apitype.TemplateBuild
	for time.Now().Before(deadline) {
		st, _ = n.svc.Build("tpl-hostile")
		if st.State == apitype.BuildFailed || st.State == apitype.BuildDone {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.State != apitype.BuildFailed {
		t.Fatalf("build: %+v, want failed", st)
	}
	if hasControl(st.Error) {
		t.Errorf("the build's error carries the guest's control characters: %q", st.Error)
	}
	failed := n.ev.wait(t, apitype.EventTemplateBuildFailed, 1)
	if len(failed) == 0 {
		t.Error("no failed event published")
	}
	for _, ev := range failed {
		if hasControl(ev.Detail) {
			t.Errorf("the failed event carries the guest's control characters: %q", ev.Detail)
		}
	}
}

// TestURLBuildsOffByDefaultAndRedirectDigestWithheld: the guard checks
// the URL's host only, and Proxmox's download-url runs wget, which follows
// redirects (pve-common Tools.pm download_file_from_url; the emulator
// follows them too): an image host the guard passes can send the node to
// the metadata service it refuses. So builds from a URL over the API are
// off unless [templates] allow_urls (refused before anything is fetched),
// and where they are on, a failed build never tells its caller the digest
// of what the node fetched.
func TestURLBuildsOffByDefaultAndRedirectDigestWithheld(t *testing.T) {
	n := newServiceNode(t)
	var mu sync.Mutex
	var asked []string
	secret := []byte("secret-role-credentials")
	n.images.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Host+r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/images/cloud.raw" {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/iam/security-credentials/", http.StatusFound)
			return
		}
		_, _ = w.Write(secret)
	})
	off, err := templatebuild.NewService(templatebuild.ServiceOptions{
		Login: func(context.Context) (templatebuild.Proxmox, error) {
			t.Error("a refused request logged in")
			return nil, errors.New("no")
		},
		Agent: n.agent, Host: templatebuild.NodeHost{StateDir: t.TempDir()}, URLs: testGuard, LockDir: t.TempDir(),
		Defaults: templatebuild.Options{Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local"},
		Publish:  func(apitype.Event) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	var inv *sandbox.InvalidError
	if _, err := off.Start(context.Background(), n.fromURL("tpl-off")); !errors.As(err, &inv) || inv.Field != "from" || !strings.Contains(err.Error(), "allow_urls") {
		t.Errorf("a URL build with allow_urls off: %v, want refused on from naming allow_urls", err)
	}
	mu.Lock()
	if len(asked) != 0 {
		t.Errorf("a refused URL build fetched %v", asked)
	}
	mu.Unlock()

	close(n.agent.gate)
	if _, err := n.svc.Start(context.Background(), n.fromURL("tpl-redirect")); err != nil {
		t.Fatalf("start: %v (the guard passes images.example)", err)
	}
	st := n.waitEnd(t, "tpl-redirect")
	sum := sha256.Sum256(secret)
	got := hex.EncodeToString(sum[:])
	if st.State != apitype.BuildFailed || !strings.Contains(st.Error, "checksum mismatch") || strings.Contains(st.Error, got) {
		t.Errorf("the redirected build: %s %q, want failed on a checksum mismatch without the digest %s of what was fetched", st.State, st.Error, got)
	}
	failed := n.ev.wait(t, apitype.EventTemplateBuildFailed, 1)
	if len(failed) == 0 {
		t.Error("no failed event published")
	}
	for _, ev := range failed {
		if strings.Contains(ev.Detail, got) {
			t.Errorf("the failed event carries the digest of what the node fetched: %q", ev.Detail)
		}
	}
}

// waitEnd polls the build of name until it is done or failed (a minute).
func (n *serviceNode) waitEnd(t *testing.T, name string) apitype.TemplateBuild {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if st, _ := n.svc.Build(name); st.State == apitype.BuildFailed || st.State == apitype.BuildDone {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, _ := n.svc.Build(name)
	t.Fatalf("build %q: %+v, want it ended", name, st)
	return st
}

// TestURLGuardEmbeddedIPv4: an IPv6 address that embeds a
// refused IPv4 one (NAT64's well-known prefix, 6to4) reaches it on a node
// with such a route; the guard passes them.
func TestURLGuardEmbeddedIPv4(t *testing.T) {
	for _, u := range []string{
		"http://[64:ff9b::a9fe:a9fe]/x.raw",   // NAT64 of 169.254.169.254
		"http://[64:ff9b::7f00:1]/x.raw",      // NAT64 of 127.0.0.1
		"http://[2002:a9fe:a9fe::1]/x.raw",    // 6to4 of 169.254.169.254
		"http://[64:ff9b:1::a9fe:a9fe]/x.raw", // local-use NAT64 (RFC 8215)
	} {
		if err := testGuard.Check(context.Background(), u); err == nil {
			t.Errorf("%s passes the guard", u)
		}
	}
}

// TestURLQueryNotInProgress: the build's state shows From
// without its query (RedactURL: "for logs and events"), yet the progress
// lines and events carry the whole URL, a presigned URL's signature with
// it.
func TestURLQueryNotInProgress(t *testing.T) {
	n := newServiceNode(t)
	close(n.agent.gate)
	req := n.fromURL("tpl-presigned")
	req.From += "?X-Amz-Signature=s3cr3tsig"
	st, err := n.svc.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(st.From, "s3cr3tsig") {
		t.Fatalf("state's from: %q", st.From)
	}
	st = n.waitState(t, "tpl-presigned", apitype.BuildDone)
	// the progress events went out before the build ended (its goroutine
	// publishes each line as it writes it); none at all would make the
	// checks below pass on nothing
	prog := n.ev.of(apitype.EventTemplateBuildProgress)
	if len(st.Progress) == 0 || len(prog) == 0 {
		t.Errorf("the build has %d progress lines and %d progress events, want some of each", len(st.Progress), len(prog))
	}
	for _, l := range st.Progress {
		if strings.Contains(l, "s3cr3tsig") {
			t.Errorf("progress line carries the URL's query: %q", l)
		}
	}
	for _, ev := range prog {
		if strings.Contains(ev.Detail, "s3cr3tsig") {
			t.Errorf("progress event carries the URL's query: %q", ev.Detail)
		}
	}
}
