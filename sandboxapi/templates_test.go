package sandboxapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// fakeBuilder is a TemplateBuilder that keeps its builds running until
// told, and publishes a progress event per start on the engine's bus.
type fakeBuilder struct {
	publish func(apitype.Event)

	// reading, when set, is told the name of each upload whose body the
	// fake starts to read.
	reading chan string

	mu     sync.Mutex
	builds map[string]apitype.TemplateBuild
	starts int
}

func (f *fakeBuilder) Start(_ context.Context, req apitype.TemplateBuildRequest) (apitype.TemplateBuild, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Name == "" || strings.Contains(req.Name, "_") {
		return apitype.TemplateBuild{}, &sandbox.InvalidError{Field: "name", Msg: fmt.Sprintf("name: template name %q", req.Name)}
	}
	if b, ok := f.builds[req.Name]; ok {
		if b.Recipe != req.Recipe {
			return apitype.TemplateBuild{}, fmt.Errorf("a build of %q runs: %w", req.Name, sandbox.ErrConflict)
		}
		b.Joined = true
		return b, nil
	}
	f.starts++
	if req.Name == "exists" {
		return apitype.TemplateBuild{Name: req.Name, Recipe: req.Recipe, State: apitype.BuildDone, VMID: 9100, Reused: true, Progress: []string{}}, nil
	}
	b := apitype.TemplateBuild{Name: req.Name, Recipe: req.Recipe, State: apitype.BuildRunning, Progress: []string{"image: downloading"}}
	f.builds[req.Name] = b
	f.publish(apitype.Event{Type: apitype.EventTemplateBuildProgress, Template: req.Name, Detail: "image: downloading"})
	return b, nil
}

// Upload refuses a file that is not an .ova (field file), answers a
// template named exists without opening the body, and otherwise opens
// the body, reads it whole and records a running build whose progress
// line is its length.
func (f *fakeBuilder) Upload(_ context.Context, u apitype.TemplateUpload, open func() (io.Reader, func(), error)) (apitype.TemplateBuild, error) {
	if !strings.HasSuffix(u.File, ".ova") {
		return apitype.TemplateBuild{}, &sandbox.InvalidError{Field: "file", Msg: "file: not an .ova"}
	}
	if u.Size > 1<<20 {
		return apitype.TemplateBuild{}, &sandbox.InvalidError{Field: "size", Msg: "size: over the limit"}
	}
	if u.Name == "exists" {
		return apitype.TemplateBuild{Name: u.Name, From: apitype.UploadSource + u.File, State: apitype.BuildDone, VMID: 9100, Reused: true, Progress: []string{}}, nil
	}
	body, release, err := open()
	if err != nil {
		return apitype.TemplateBuild{}, err
	}
	defer release()
	if f.reading != nil {
		f.reading <- u.Name
	}
	n, err := io.Copy(io.Discard, body)
	if err != nil {
		return apitype.TemplateBuild{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	b := apitype.TemplateBuild{Name: u.Name, From: apitype.UploadSource + u.File, State: apitype.BuildQueued, Progress: []string{fmt.Sprintf("upload: %d bytes", n)}}
	f.builds[u.Name] = b
	return b, nil
}

func (f *fakeBuilder) Template(_ context.Context, name string) (apitype.TemplateBuild, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.builds[name]
	return b, ok, nil
}

func (f *fakeBuilder) startCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

// minter mints tokens in store (name, owner, scope) and returns a client
// of url with each.
func minter(t *testing.T, store *auth.Store, url string) func(name, owner, scope string) *client.Client {
	return func(name, owner, scope string) *client.Client {
		t.Helper()
		tok, _, err := store.CreateOwned(name, owner, []string{scope}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return client.New(url, client.WithToken(tok))
	}
}

// TestTemplateBuildsOff: a node without builds answers both routes
// forbidden, saying how to turn them on or build on the node; healthz
// says it has none.
func TestTemplateBuildsOff(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	_, err := e.c.BuildTemplate(ctx, apitype.TemplateBuildRequest{Name: "debian13", Recipe: "debian13"})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Status != 403 || !strings.Contains(p.Detail, "[templates] build = true") || !strings.Contains(p.Detail, "pve-inspectd template build NAME --recipe") {
		t.Errorf("build on a node without builds: %v", err)
	}
	if _, err := e.c.TemplateBuild(ctx, "debian13"); !client.IsProblem(err, apitype.ProblemForbidden) {
		t.Errorf("get on a node without builds: %v", err)
	}
	if h, err := e.c.Health(ctx); err != nil || h.TemplateBuilds {
		t.Errorf("healthz: %+v %v, want no template builds", h, err)
	}
}

// TestTemplateBuildRoutes: the build routes are node operations for
// unbound admin tokens and the local socket: an owner-bound admin token
// and lesser scopes are refused before the builder is asked; a body that
// does not decode or that the builder refuses changes nothing; a second
// request joins, another source conflicts, an existing template answers
// 200; the build's events reach unbound streams only.
func TestTemplateBuildRoutes(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	f := &fakeBuilder{builds: map[string]apitype.TemplateBuild{}}
	e := newEnv(t, func(o *options) {
		o.serverOptions.Tokens = store
		o.serverOptions.Templates = f
	})
	f.publish = e.srv.Engine().PublishNodeEvent
	ctx := e.ctx()
	mint := minter(t, store, e.tcp.URL)
	alice, ops, reader, execer := mint("alice-agent", "alice", "admin"), mint("ops", "", "admin"), mint("r", "", "read"), mint("x", "", "exec")
	req := apitype.TemplateBuildRequest{Name: "debian13", Recipe: "debian13"}

	if h, err := ops.Health(ctx); err != nil || !h.TemplateBuilds {
		t.Errorf("healthz: %+v %v, want template builds", h, err)
	}
	for who, c := range map[string]*client.Client{"owner-bound admin": alice, "read": reader, "exec": execer} {
		if _, err := c.BuildTemplate(ctx, req); !client.IsProblem(err, apitype.ProblemForbidden) {
			t.Errorf("%s token's build: %v, want forbidden", who, err)
		}
		if _, err := c.TemplateBuild(ctx, "debian13"); !client.IsProblem(err, apitype.ProblemForbidden) {
			t.Errorf("%s token's get: %v, want forbidden", who, err)
		}
	}
	if _, err := alice.BuildTemplate(ctx, req); err == nil || !strings.Contains(err.Error(), "node operation") {
		t.Errorf("owner-bound refusal does not say why: %v", err)
	}
	if _, err := ops.BuildTemplate(ctx, apitype.TemplateBuildRequest{Name: "bad_name", Recipe: "debian13"}); !client.IsProblem(err, apitype.ProblemInvalidRequest) {
		t.Errorf("invalid name: %v", err)
	}
	var p *apitype.Problem
	if _, err := ops.BuildTemplate(ctx, apitype.TemplateBuildRequest{Name: "bad_name"}); !errors.As(err, &p) || p.Field != "name" {
		t.Errorf("invalid name's problem: %v, want field name", err)
	}
	if f.startCount() != 0 || len(f.builds) != 0 {
		t.Fatalf("refused requests reached the builder: %d starts", f.startCount())
	}

	st, err := ops.BuildTemplate(ctx, req)
	if err != nil || st.State != apitype.BuildRunning || st.Joined {
		t.Fatalf("build: %+v %v", st, err)
	}
	if st, err := e.c.BuildTemplate(ctx, req); err != nil || !st.Joined {
		t.Errorf("second request (local socket): %+v %v, want joined", st, err)
	}
	if _, err := ops.BuildTemplate(ctx, apitype.TemplateBuildRequest{Name: "debian13", Recipe: "ubuntu24.04"}); !client.IsProblem(err, apitype.ProblemConflict) {
		t.Errorf("another source: %v, want conflict", err)
	}
	if got, err := ops.TemplateBuild(ctx, "debian13"); err != nil || got.State != apitype.BuildRunning {
		t.Errorf("get: %+v %v", got, err)
	}
	if _, err := ops.TemplateBuild(ctx, "nothing"); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("get of no build: %v", err)
	}
	if st, err := ops.BuildTemplate(ctx, apitype.TemplateBuildRequest{Name: "exists", Recipe: "debian13"}); err != nil || st.State != apitype.BuildDone || !st.Reused {
		t.Errorf("existing template: %+v %v", st, err)
	}

	// alice's own event after the build's: her stream, replayed from the
	// start, reaches it without a template event; ops's has the build's.
	if _, err := alice.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}); err != nil {
		t.Fatal(err)
	}
	seen := func(c *client.Client, until string) []apitype.Event {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var evs []apitype.Event
		stop := errors.New("stop")
		err := c.Events(sctx, client.EventsRequest{Resume: true}, func(ev apitype.Event) error {
			evs = append(evs, ev)
			if ev.Type == until {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) {
			t.Errorf("stream ended before a %s event: %v (%+v)", until, err, evs)
		}
		return evs
	}
	for _, ev := range seen(alice, apitype.EventCreated) {
		if strings.HasPrefix(ev.Type, "template.") {
			t.Errorf("owner-bound stream carries %+v", ev)
		}
	}
	evs := seen(ops, apitype.EventTemplateBuildProgress)
	if last := evs[len(evs)-1]; last.Template != "debian13" || last.Owner != "" || last.Detail != "image: downloading" {
		t.Errorf("template event on the unbound stream: %+v", last)
	}
}

// TestTemplateBuildSaysItsImage: GET /v1/templates/builds/{name} carries
// the image a template was built from (image), declared in the OpenAPI
// document, for a client that finds a template by name to compare.
func TestTemplateBuildSaysItsImage(t *testing.T) {
	img := "sha256:" + strings.Repeat("ab", 32)
	f := &fakeBuilder{builds: map[string]apitype.TemplateBuild{
		"ova-box-ova-10240": {Name: "ova-box-ova-10240", State: apitype.BuildDone, VMID: 9100, Reused: true, Image: img, Progress: []string{}}}}
	e := newEnv(t, func(o *options) { o.serverOptions.Templates = f })
	ctx := e.ctx()
	st, err := e.c.TemplateBuild(ctx, "ova-box-ova-10240")
	if err != nil || st.Image != img {
		t.Errorf("get: %+v %v, want image %s", st, err, img)
	}
	doc, err := e.c.OpenAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	props := doc["components"].(map[string]any)["schemas"].(map[string]any)["TemplateBuild"].(map[string]any)["properties"].(map[string]any)
	if _, ok := props["image"]; !ok {
		t.Errorf("TemplateBuild declares no image: %v", props)
	}
	get := doc["paths"].(map[string]any)["/v1/templates/builds/{name}"].(map[string]any)["get"].(map[string]any)
	if s, _ := get["summary"].(string); !strings.Contains(s, "image") {
		t.Errorf("the get's summary does not say it carries the image: %q", s)
	}
}

// fakeCatalog is a TemplateCatalog of fixed templates.
type fakeCatalog struct {
	t map[string]apitype.TemplateInfo
}

func (c *fakeCatalog) Template(_ context.Context, name string) (apitype.TemplateInfo, bool, error) {
	t, ok := c.t[name]
	return t, ok, nil
}

// TestTemplateInfoRoute: GET /v1/templates/{name} answers every token of
// the node, an owner-bound one and a read one included, on a node without
// builds too (the Python provider's check of an OVA's template runs with
// the token of its eval): the template's VMID, whether the node's builds
// made it and the image its ledger records; a name without a template is
// not-found. The document declares it of scope read, no node operation,
// with its 404.
func TestTemplateInfoRoute(t *testing.T) {
	img := "sha256:" + strings.Repeat("cd", 32)
	cat := &fakeCatalog{t: map[string]apitype.TemplateInfo{
		"ova-box-ova-10240": {Name: "ova-box-ova-10240", VMID: 9100, Built: true, Image: img},
		"debian":            {Name: "debian", VMID: 9000},
	}}
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.serverOptions.Tokens = store
		o.serverOptions.TemplateCatalog = cat // no Templates: builds are off
	})
	ctx := e.ctx()
	mint := minter(t, store, e.tcp.URL)
	for who, c := range map[string]*client.Client{
		"owner-bound admin": mint("alice-agent", "alice", "admin"),
		"owner-bound read":  mint("bob-reader", "bob", "read"),
		"read":              mint("r", "", "read"),
		"local socket":      e.c,
	} {
		got, err := c.Template(ctx, "ova-box-ova-10240")
		if err != nil || got != cat.t["ova-box-ova-10240"] {
			t.Errorf("%s: %+v %v, want %+v", who, got, err, cat.t["ova-box-ova-10240"])
		}
		if got, err := c.Template(ctx, "debian"); err != nil || got.Built || got.Image != "" || got.VMID != 9000 {
			t.Errorf("%s, a template not built here: %+v %v", who, got, err)
		}
		if _, err := c.Template(ctx, "none"); !client.IsProblem(err, apitype.ProblemNotFound) {
			t.Errorf("%s, no template of the name: %v, want not-found", who, err)
		}
	}
	if _, err := e.c.TemplateBuild(ctx, "ova-box-ova-10240"); !client.IsProblem(err, apitype.ProblemForbidden) {
		t.Errorf("the builds route on a node without builds: %v, want forbidden", err)
	}

	doc, err := e.c.OpenAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	get := doc["paths"].(map[string]any)["/v1/templates/{name}"].(map[string]any)["get"].(map[string]any)
	if get["x-scope"] != apitype.ScopeRead || get["x-node-operation"] != nil {
		t.Errorf("GET /v1/templates/{name}: scope %v, node operation %v: want read, none", get["x-scope"], get["x-node-operation"])
	}
	if _, ok := get["responses"].(map[string]any)["404"]; !ok {
		t.Errorf("GET /v1/templates/{name} declares no 404: %v", get["responses"])
	}
	props := doc["components"].(map[string]any)["schemas"].(map[string]any)["TemplateInfo"].(map[string]any)["properties"].(map[string]any)
	for _, p := range []string{"name", "vmid", "built", "image"} {
		if _, ok := props[p]; !ok {
			t.Errorf("TemplateInfo declares no %s: %v", p, props)
		}
	}
}

// TestConcretePathAnswersOnlyItsMethods (schemathesis, all four token
// scopes): /v1/templates/build is POST's alone, though GET
// /v1/templates/{name} would take "build" as a name: OPTIONS and GET of
// it answer 405 with Allow naming POST only (the OpenAPI document's
// methods of the concrete path), nothing is looked up, and a wildcard
// path keeps its own methods.
func TestConcretePathAnswersOnlyItsMethods(t *testing.T) {
	cat := &fakeCatalog{t: map[string]apitype.TemplateInfo{"build": {Name: "build", VMID: 9100}}}
	e := newEnv(t, func(o *options) { o.serverOptions.TemplateCatalog = cat })
	for _, tc := range []struct{ method, path, allow string }{
		{"OPTIONS", "/v1/templates/build", "POST"},
		{"GET", "/v1/templates/build", "POST"},
		{"OPTIONS", "/v1/sandboxes", "POST, GET, HEAD"},
		{"OPTIONS", "/v1/templates/debian", "GET, HEAD"},
	} {
		resp := e.raw(tc.method, tc.path, "", nil)
		p := decodeProblemResp(t, resp)
		if resp.StatusCode != 405 || p.Type != apitype.ProblemMethodNotAllowed || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d %q, Allow %q; want 405, Allow %q", tc.method, tc.path, resp.StatusCode, p.Type, resp.Header.Get("Allow"), tc.allow)
		}
	}
}
