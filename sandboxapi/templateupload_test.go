package sandboxapi_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestTemplateUploadRoute: PUT /v1/templates/build/{name}/image is a node
// operation (owner-bound and lesser tokens refused before the builder is
// asked, off without builds); a request without Content-Length or that
// the builder refuses is a 400 naming the field; an upload streams its
// body to the builder, an existing template answers 200 reused.
func TestTemplateUploadRoute(t *testing.T) {
	off := newEnv(t, nil)
	u := apitype.TemplateUpload{Name: "win", File: "win.ova", SHA256: strings.Repeat("a", 64), OVADisk: "d.vmdk", Size: 5}
	if _, err := off.c.UploadTemplate(off.ctx(), u, strings.NewReader("hello")); !client.IsProblem(err, apitype.ProblemForbidden) {
		t.Errorf("upload on a node without builds: %v", err)
	}

	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	f := &fakeBuilder{builds: map[string]apitype.TemplateBuild{}}
	e := newEnv(t, func(o *options) {
		o.serverOptions.Tokens = store
		o.serverOptions.Templates = f
	})
	ctx := e.ctx()
	mint := func(name, owner, scope string) (*client.Client, string) {
		t.Helper()
		tok, _, err := store.CreateOwned(name, owner, []string{scope}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return client.New(e.tcp.URL, client.WithToken(tok)), tok
	}
	alice, _ := mint("alice-agent", "alice", "admin")
	reader, _ := mint("r", "", "read")
	ops, opsTok := mint("ops", "", "admin")
	for who, c := range map[string]*client.Client{"owner-bound admin": alice, "read": reader} {
		if _, err := c.UploadTemplate(ctx, u, strings.NewReader("hello")); !client.IsProblem(err, apitype.ProblemForbidden) {
			t.Errorf("%s token's upload: %v, want forbidden", who, err)
		}
	}
	var p *apitype.Problem
	bad := u
	bad.File = "win.iso"
	if _, err := ops.UploadTemplate(ctx, bad, strings.NewReader("hello")); !errors.As(err, &p) || p.Status != 400 || p.Field != "file" {
		t.Errorf("bad file: %v, want 400 naming file", err)
	}
	big := u
	big.Size = 2 << 20
	if _, err := ops.UploadTemplate(ctx, big, strings.NewReader(strings.Repeat("x", 2<<20))); !errors.As(err, &p) || p.Status != 400 || p.Field != "size" {
		t.Errorf("over the limit: %v, want 400 naming size", err)
	}
	// no Content-Length: a chunked body
	req, err := http.NewRequestWithContext(ctx, "PUT", e.tcp.URL+"/v1/templates/build/win/image?file=win.ova&sha256="+u.SHA256+"&ova_disk=d.vmdk", io.NopCloser(strings.NewReader("hello")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+opsTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "Content-Length") {
		t.Errorf("chunked upload: %d %s, want 400 naming Content-Length", resp.StatusCode, b)
	}
	if f.startCount() != 0 || len(f.builds) != 0 {
		t.Fatalf("refused uploads reached the builder: %d starts", f.startCount())
	}

	st, err := ops.UploadTemplate(ctx, u, strings.NewReader("hello"))
	if err != nil || st.State != apitype.BuildQueued || st.From != "upload:win.ova" || len(st.Progress) != 1 || st.Progress[0] != "upload: 5 bytes" {
		t.Errorf("upload: %+v %v", st, err)
	}
	if got, err := ops.TemplateBuild(ctx, "win"); err != nil || got.From != "upload:win.ova" {
		t.Errorf("get after the upload: %+v %v", got, err)
	}
	ex := u
	ex.Name = "exists"
	if st, err := e.c.UploadTemplate(ctx, ex, strings.NewReader("hello")); err != nil || st.State != apitype.BuildDone || !st.Reused {
		t.Errorf("existing template (local socket): %+v %v", st, err)
	}
}

// TestTemplateUploadsInFlightAreCapped: the node takes maxUploads (2)
// image uploads at once; one more is refused before its body is read,
// 429 too-many-requests naming the quota image-uploads with Retry-After
// (declared in the OpenAPI document), and taken once one ends. An upload
// the builder answers without its body (an existing template) takes no
// slot: it is answered while both are held.
func TestTemplateUploadsInFlightAreCapped(t *testing.T) {
	f := &fakeBuilder{builds: map[string]apitype.TemplateBuild{}, reading: make(chan string, 4)}
	e := newEnv(t, func(o *options) { o.serverOptions.Templates = f })
	ctx := e.ctx()
	u := apitype.TemplateUpload{SHA256: strings.Repeat("a", 64), OVADisk: "d.vmdk", Size: 5}
	var writers []*io.PipeWriter
	done := make(chan error, 2)
	for _, name := range []string{"one", "two"} {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		up := u
		up.Name, up.File = name, name+".ova"
		go func() {
			_, err := e.c.UploadTemplate(ctx, up, pr)
			done <- err
		}()
		if got := <-f.reading; got != name {
			t.Fatalf("reading %q, want %q", got, name)
		}
	}
	third := func() *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "PUT", e.http.URL+"/v1/templates/build/three/image?file=three.ova&ova_disk=d.vmdk&sha256="+u.SHA256, strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	resp := third()
	var p apitype.Problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	if resp.StatusCode != http.StatusTooManyRequests || p.Type != apitype.ProblemTooManyRequests || p.Quota != "image-uploads" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a third upload in flight: %d %+v Retry-After %q, want 429 naming image-uploads with Retry-After", resp.StatusCode, p, resp.Header.Get("Retry-After"))
	}
	if len(f.reading) != 0 {
		t.Errorf("the refused upload reached the builder")
	}
	// an upload answered without its body (the template exists: done,
	// reused) needs no slot: it is answered while both are held
	ex := u
	ex.Name, ex.File = "exists", "exists.ova"
	if st, err := e.c.UploadTemplate(ctx, ex, strings.NewReader("hello")); err != nil || st.State != apitype.BuildDone || !st.Reused {
		t.Errorf("an upload of an existing template while the slots are held: %+v %v, want done and reused", st, err)
	}
	for _, pw := range writers {
		_, _ = pw.Write([]byte("hello"))
		_ = pw.Close()
	}
	for range writers {
		if err := <-done; err != nil {
			t.Errorf("upload: %v", err)
		}
	}
	if resp := third(); resp.StatusCode != http.StatusAccepted {
		t.Errorf("an upload once the others ended: %d, want 202", resp.StatusCode)
	}

	doc, err := e.c.OpenAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := doc["paths"].(map[string]any)["/v1/templates/build/{name}/image"].(map[string]any)["put"].(map[string]any)["responses"].(map[string]any)
	r429, _ := put["429"].(map[string]any)
	if h, _ := r429["headers"].(map[string]any); h["Retry-After"] == nil {
		t.Errorf("the upload's 429 is not declared with Retry-After: %v", r429)
	}
}

// TestTemplateUploadStalledEnds: an upload whose client stops sending is
// cut once it sent nothing for TemplateUploadIdle (not at the route's
// hours-long timeout), and its slot serves the next upload; a client that
// keeps sending is never cut by it.
func TestTemplateUploadStalledEnds(t *testing.T) {
	f := &fakeBuilder{builds: map[string]apitype.TemplateBuild{}, reading: make(chan string, 8)}
	e := newEnv(t, func(o *options) {
		o.serverOptions.Templates = f
		o.serverOptions.TemplateUploadIdle = time.Second
	})
	ctx := e.ctx()
	sum := strings.Repeat("a", 64)
	put := func(name string, body io.Reader, size int64) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, "PUT", e.http.URL+"/v1/templates/build/"+name+"/image?file="+name+".ova&ova_disk=d.vmdk&sha256="+sum, body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = size
		return http.DefaultClient.Do(req)
	}
	// two stalled uploads take both slots, then send nothing
	var writers []*io.PipeWriter
	ended := make(chan struct{}, 2)
	for _, name := range []string{"one", "two"} {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		go func() {
			if resp, err := put(name, pr, 10); err == nil {
				resp.Body.Close()
			}
			ended <- struct{}{}
		}()
		if _, err := pw.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		if got := <-f.reading; got != name {
			t.Fatalf("reading %q, want %q", got, name)
		}
	}
	defer func() {
		for _, pw := range writers {
			_ = pw.CloseWithError(io.ErrClosedPipe)
		}
	}()
	for range 2 {
		select {
		case <-ended:
		case <-ctx.Done():
			t.Fatal("a stalled upload was never cut")
		}
	}
	// the slots are free again, and a slow but steady upload is not cut:
	// 15 parts, each sent well within the idle time, together longer
	pr, pw := io.Pipe()
	go func() {
		for range 15 {
			time.Sleep(100 * time.Millisecond)
			if _, err := pw.Write([]byte("xx")); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	resp, err := put("three", pr, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("a steady upload after the stalled ones were cut: %d %s, want 202", resp.StatusCode, b)
	}
}
