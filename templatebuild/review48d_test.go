package templatebuild_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/pve-inspect/pve-inspect/qga"
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

// TestReview48dGuestErrorSanitized: the guest agent's error text (its
// untrusted desc) reaches a failed build's Error and its
// template.build.failed event without its control characters, as the
// progress lines do.
func TestReview48dGuestErrorSanitized(t *testing.T) {
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
	for _, ev := range n.ev.of(apitype.EventTemplateBuildFailed) {
		if hasControl(ev.Detail) {
			t.Errorf("the failed event carries the guest's control characters: %q", ev.Detail)
		}
	}
}

// TestReview48dRedirectBypassesURLGuard: the guard checks the URL's host
// only; Proxmox's download-url runs wget, which follows redirects (pve-common
// Tools.pm download_file_from_url; the emulator follows them too), so an
// image host the guard passes sends the node to the metadata service it
// refuses. The node must never ask the refused address.
func TestReview48dRedirectBypassesURLGuard(t *testing.T) {
	n := newServiceNode(t)
	if err := testGuard.Check(context.Background(), "http://169.254.169.254/latest/meta-data/"); err == nil {
		t.Fatal("the guard passes the metadata address itself")
	}
	var mu sync.Mutex
	var asked []string
	n.images.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Host+r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/images/cloud.raw" {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/iam/security-credentials/", http.StatusFound)
			return
		}
		_, _ = w.Write([]byte("secret-role-credentials"))
	})
	close(n.agent.gate)
	if _, err := n.svc.Start(context.Background(), n.fromURL("tpl-redirect")); err != nil {
		t.Fatalf("start: %v (the guard passes images.example)", err)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if st, _ := n.svc.Build("tpl-redirect"); st.State == apitype.BuildFailed || st.State == apitype.BuildDone {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, _ := n.svc.Build("tpl-redirect")
	if strings.Contains(st.Error, "checksum mismatch: got") {
		t.Errorf("the failed build tells the caller the digest of what the node fetched: %q", st.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range asked {
		if strings.HasPrefix(a, "169.254.169.254") {
			t.Errorf("the node fetched %s, an address the URL guard refuses, through a redirect (asked: %v)", a, asked)
		}
	}
}

// TestReview48dURLGuardEmbeddedMetadata: an IPv6 address that embeds a
// refused IPv4 one (NAT64's well-known prefix, 6to4) reaches it on a node
// with such a route; the guard passes them.
func TestReview48dURLGuardEmbeddedMetadata(t *testing.T) {
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

// TestReview48dURLQueryNotInProgress: the build's state shows From
// without its query (RedactURL: "for logs and events"), yet the progress
// lines and events carry the whole URL, a presigned URL's signature with
// it.
func TestReview48dURLQueryNotInProgress(t *testing.T) {
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
	for _, l := range st.Progress {
		if strings.Contains(l, "s3cr3tsig") {
			t.Errorf("progress line carries the URL's query: %q", l)
		}
	}
	for _, ev := range n.ev.of(apitype.EventTemplateBuildProgress) {
		if strings.Contains(ev.Detail, "s3cr3tsig") {
			t.Errorf("progress event carries the URL's query: %q", ev.Detail)
		}
	}
}
