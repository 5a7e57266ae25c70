package templatebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Errors of Service.Start besides a *sandbox.InvalidError (a request
// refused as asked, naming its field). Each wraps the engine's sentinel
// the sandbox API answers for it (conflict, unavailable).
var (
	// ErrBuildConflict: another build of the name runs from another
	// source; wait for it.
	ErrBuildConflict = fmt.Errorf("template build: %w", sandbox.ErrConflict)
	// ErrNotRunning: the service is not running (the daemon starts or
	// stops).
	ErrNotRunning = fmt.Errorf("template builds are not running: %w", sandbox.ErrBusy)
	// ErrBuildsFull: as many builds as the node takes are queued or run.
	ErrBuildsFull = fmt.Errorf("the node's template build queue is full: %w", sandbox.ErrBusy)
)

// loginError is a failed login of the builder (its password file, or
// Proxmox refusing it): the node cannot build until an operator fixes it
// (sandbox.ErrNotConfigured: the API answers unavailable).
type loginError struct{ err error }

func (e loginError) Error() string   { return "log in as the template builder: " + e.err.Error() }
func (e loginError) Unwrap() []error { return []error{e.err, sandbox.ErrNotConfigured} }

func badRequest(field, format string, a ...any) error {
	return &sandbox.InvalidError{Field: field, Msg: fmt.Sprintf(field+": "+format, a...)}
}

func invalidField(field string, err error) error {
	return &sandbox.InvalidError{Field: field, Msg: field + ": " + err.Error()}
}

// ServiceOptions configure a Service.
type ServiceOptions struct {
	// Login returns a Proxmox client logged in with the builder's own
	// credential, never the daemon's sandbox token (see the package doc's
	// Privileges). It is called for each build and each lookup, so a
	// changed password file takes effect without a restart.
	Login func(ctx context.Context) (Proxmox, error)
	Agent Agent
	Host  Host
	// Defaults are every build's Options but Name, Recipe, Progress and
	// Log (storages, bridge, waits).
	Defaults Options
	// URLs checks the URL of a build from an image URL.
	URLs URLGuard
	// AllowURLs takes builds from an image URL ([templates] allow_urls);
	// off, only the shipped recipes (their URLs pinned in this package)
	// are built: Proxmox's download follows redirects and resolves the
	// host again, which URLs cannot check, so a URL an admin gives could
	// make the node fetch what only it reaches.
	AllowURLs bool
	// Mirror, when set ([templates] mirror), is where the shipped recipes'
	// images and checksum lists are fetched from instead of the
	// distributions' servers (MirrorRecipe); each build's URLs of it pass
	// URLs first.
	Mirror string
	// MaxUpload bounds an image uploaded for a build (Upload; 20 GiB).
	MaxUpload int64
	// MaxRunning is how many builds run at once on the node (1; at most
	// 2: each downloads an image and boots a VM); MaxBuilds how many may
	// be queued or running (8); Keep how many finished builds are
	// remembered for Build (32, the oldest forgotten first).
	MaxRunning, MaxBuilds, Keep int
	// Grant, when set, lets the daemon's sandbox token clone the template
	// a build made or found (the daemon: PVEInspectTemplate on /vms/ID, as
	// pve-access-setup grants the templates it is given), with px, the
	// builder's client. A failed grant fails the build, saying what to run.
	Grant func(ctx context.Context, px Proxmox, vmid int) error
	// LockDir holds the per-name build locks (Lock) and the locks of
	// images being unpacked (Options.LockDir), shared with
	// `pve-inspectd template build` on the node.
	LockDir string
	// Catalog answers Template for a name no build of is remembered
	// (the daemon's, shared with GET /v1/templates/{name}); nil: one of
	// the service's own over the builder's list of VMs and Host's ledger.
	// The service makes it look again whenever a build ends.
	Catalog *Catalog
	// Publish receives the builds' events (template.build.progress,
	// .done, .failed); nil drops them. Never called with the service's
	// lock held.
	Publish func(apitype.Event)
	Now     func() time.Time
	Log     *slog.Logger
}

// Service runs the daemon's template builds (POST /v1/templates/build):
// one build per template name at a time (a second request for the name
// joins it), at most MaxRunning at once on the node, each in a goroutine
// that Run owns and stops when its context ends (the build's VM, still
// tagged building, is left for the next build of the name to destroy).
type Service struct {
	o     ServiceOptions
	slots chan struct{}
	wg    sync.WaitGroup
	// room is the room the uploads in flight hold on the image storages,
	// under its own leaf lock: the Service's uploads' and its builds'
	// archive uploads'.
	room *roomHolds

	// The mutex protects the following elements; a leaf (nothing is
	// called out while it is held).
	mu sync.Mutex
	// ctx is Run's context while Run runs, nil otherwise.
	ctx context.Context
	// builds are the queued, running and remembered builds by name;
	// finished lists the finished ones' names, oldest first.
	builds   map[string]*build
	finished []string
	// uploading are the image files an Upload sends to the node now.
	uploading map[string]bool
}

// build is one build; its state is guarded by Service.mu.
type build struct {
	req   apitype.TemplateBuildRequest
	state apitype.TemplateBuild
	// partial is a progress line not yet ended by a newline.
	partial []byte
}

// NewService checks the options and returns a Service; run it with Run.
func NewService(o ServiceOptions) (*Service, error) {
	if o.Login == nil || o.Agent == nil || o.Host == nil {
		return nil, errors.New("templatebuild: Login, Agent and Host are required")
	}
	check := o.Defaults
	check.Name, check.Recipe = "check", Recipe{Image: Image{URL: "http://check/x.raw", File: "x.raw"}}
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("templatebuild: %w", err)
	}
	orDefault(&o.MaxRunning, 1)
	orDefault(&o.MaxBuilds, 8)
	orDefault(&o.Keep, 32)
	if o.MaxUpload == 0 {
		o.MaxUpload = apitype.DefaultMaxTemplateUpload
	}
	if o.MaxRunning < 1 || o.MaxRunning > 2 || o.MaxBuilds < o.MaxRunning || o.Keep < 1 || o.MaxUpload < 1 {
		return nil, fmt.Errorf("templatebuild: MaxRunning %d (1 or 2), MaxBuilds %d (at least MaxRunning), Keep %d (at least 1), MaxUpload %d (at least 1)", o.MaxRunning, o.MaxBuilds, o.Keep, o.MaxUpload)
	}
	if o.LockDir == "" {
		o.LockDir = "/run/pve-inspectd"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Publish == nil {
		o.Publish = func(apitype.Event) {}
	}
	if o.Catalog == nil {
		login, host := o.Login, o.Host
		cat, err := NewCatalog(CatalogOptions{Ledger: host, Now: o.Now, List: func(ctx context.Context) ([]sandbox.VMInfo, error) {
			px, err := login(ctx)
			if err != nil {
				return nil, loginError{err}
			}
			return px.ListVMs(ctx)
		}})
		if err != nil {
			return nil, err
		}
		o.Catalog = cat
	}
	return &Service{o: o, slots: make(chan struct{}, o.MaxRunning), builds: map[string]*build{}, uploading: map[string]bool{}, room: &roomHolds{}}, nil
}

func orDefault(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

// Run serves builds until ctx ends, then waits for the running builds,
// which end with ctx, to return.
func (s *Service) Run(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.ctx = nil // no build starts from now on: wg.Add happens under mu
	s.mu.Unlock()
	s.wg.Wait()
}

// Build returns the state of the build of name: running, or the last
// one that finished (false: none remembered).
func (s *Service) Build(name string) (apitype.TemplateBuild, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.builds[name]
	if !ok {
		return apitype.TemplateBuild{}, false
	}
	return b.snapshot(), true
}

// recorded is the build ledger's record of template vmid: the image it
// was built from ("" when it records none) and how (its Mode).
func (s *Service) recorded(vmid int) (Record, error) {
	rec, _, err := s.o.Host.Recorded(vmid)
	if err != nil {
		return Record{}, fmt.Errorf("build ledger of VM %d: %w", vmid, err)
	}
	return rec, nil
}

func (b *build) snapshot() apitype.TemplateBuild {
	st := b.state
	st.Progress = slices.Clone(st.Progress)
	if st.Progress == nil {
		st.Progress = []string{}
	}
	return st
}

func active(st apitype.TemplateBuild) bool {
	return st.State == apitype.BuildQueued || st.State == apitype.BuildRunning
}

// Start starts a build of req, or joins the one of its name that is
// queued or running (Joined set), or answers that the template exists
// (done, Reused). A request refused as asked is a *sandbox.InvalidError; a
// running build of the name from another source ErrBuildConflict.
func (s *Service) Start(ctx context.Context, req apitype.TemplateBuildRequest) (apitype.TemplateBuild, error) {
	recipe, err := s.recipe(ctx, req)
	if err != nil {
		return apitype.TemplateBuild{}, err
	}
	st, _, done, err := s.joinOrFind(ctx, req, recipe.Name)
	if done || err != nil {
		return st, err
	}
	return s.launch(req, recipe)
}

// joinOrFind answers req without building (done): the build of its name
// that is queued or running, or the template of the name that exists
// (built by recipe, "" for one from an image alone), granted to the
// daemon's token. Otherwise it returns the builder's client, logged in.
func (s *Service) joinOrFind(ctx context.Context, req apitype.TemplateBuildRequest, recipe string) (st apitype.TemplateBuild, px Proxmox, done bool, err error) {
	if st, ok, err := s.join(req); ok || err != nil {
		return st, nil, true, err
	}
	if px, err = s.o.Login(ctx); err != nil {
		return apitype.TemplateBuild{}, nil, true, loginError{err}
	}
	vmid, rep, ok, err := Existing(ctx, px, s.o.Host, req.Name, recipe)
	if err != nil {
		return apitype.TemplateBuild{}, nil, true, fmt.Errorf("look for template %q: %w", req.Name, err)
	}
	if !ok {
		return apitype.TemplateBuild{}, px, false, nil
	}
	rec, err := s.recorded(vmid)
	if err != nil {
		return apitype.TemplateBuild{}, nil, true, fmt.Errorf("look for template %q: %w", req.Name, err)
	}
	if err := sameBuild(req, vmid, rec); err != nil {
		return apitype.TemplateBuild{}, nil, true, err
	}
	if err := UEFIAllowed(req.Name, vmid, rep, s.o.Defaults.AllowUEFI); err != nil {
		return apitype.TemplateBuild{}, nil, true, err
	}
	if err := s.grant(ctx, px, vmid); err != nil {
		return apitype.TemplateBuild{}, nil, true, err
	}
	st, err = s.exists(req, vmid, rec)
	return st, nil, true, err
}

// sameBuild refuses to answer req with the template vmid when the
// ledger's record of it (rec) says it was built another way (its Mode:
// booted, or imported without boot on another bus or ostype), or, for an
// upload (req from apitype.UploadSource), from another image: a template
// is found by its name, and an OVA's name (the Python provider's
// ova-FILE-SIZE, the reference's tag) says nothing of its content or of
// how it was built, so another image of the same name and size, or the
// same image asked the other way, would otherwise get this one's system.
func sameBuild(req apitype.TemplateBuildRequest, vmid int, rec Record) error {
	if want := Mode(req.BuildMode); rec.Mode != want {
		return fmt.Errorf("%w: template %q (VM %d) exists, %s, not %s as asked: name the template after this build, or remove the template to build it again",
			ErrBuildConflict, req.Name, vmid, rec.Mode, want)
	}
	if !strings.HasPrefix(req.From, apitype.UploadSource) || rec.Image == req.Checksum {
		return nil
	}
	was := "an image the build ledger does not record"
	if rec.Image != "" {
		was = "another image (" + rec.Image + ")"
	}
	return fmt.Errorf("%w: template %q (VM %d) exists, built from %s, not from the one sent (%s): name the template after this image, or remove the template to build it again",
		ErrBuildConflict, req.Name, vmid, was, req.Checksum)
}

// recipe checks req and returns the recipe it asks for.
func (s *Service) recipe(ctx context.Context, req apitype.TemplateBuildRequest) (Recipe, error) {
	if err := ValidName(req.Name); err != nil {
		return Recipe{}, invalidField("name", err)
	}
	if req.BuildMode != (apitype.BuildMode{}) {
		field := "import_only"
		if !req.ImportOnly {
			field = map[bool]string{true: "disk_bus", false: "os_type"}[req.DiskBus != ""]
		}
		return Recipe{}, badRequest(field, "a build without boot takes an image sent to the node (PUT /v1/templates/build/%s/image?import_only=true) or one on it (pve-inspectd template build %s --from STORAGE:import/FILE --import-only), not a recipe or a URL", req.Name, req.Name)
	}
	switch {
	case req.Recipe != "" && req.From != "":
		return Recipe{}, badRequest("from", "give a recipe or an image URL, not both")
	case req.Recipe != "":
		r, ok := Recipes()[req.Recipe]
		if !ok {
			return Recipe{}, badRequest("recipe", "unknown recipe %q; shipped: %s", req.Recipe, strings.Join(RecipeNames(), ", "))
		}
		if req.Checksum != "" || req.OVADisk != "" {
			return Recipe{}, badRequest("checksum", "checksum and ova_disk go with from: a recipe pins its own")
		}
		return s.mirrored(ctx, r)
	case req.From != "" && !s.o.AllowURLs:
		return Recipe{}, badRequest("from", "builds from an image URL are off on this node ([templates] allow_urls): Proxmox's download follows redirects the daemon cannot check; build a shipped recipe (%s), or on the node: pve-inspectd template build %s --from URL --checksum ALG:HEX", strings.Join(RecipeNames(), ", "), req.Name)
	case req.From != "":
		if !strings.Contains(req.From, "://") {
			return Recipe{}, badRequest("from", "want an http(s) URL; an image already on the node is built there: pve-inspectd template build %s --from STORAGE:import/FILE", req.Name)
		}
		if req.Checksum == "" {
			return Recipe{}, badRequest("checksum", "an image URL needs its checksum (sha256:HEX or sha512:HEX): the node downloads only what Proxmox can verify")
		}
		img, err := ImageFromURL(req.From, req.Checksum, req.OVADisk)
		if err != nil {
			return Recipe{}, invalidField("from", err)
		}
		if err := s.o.URLs.Check(ctx, req.From); err != nil {
			return Recipe{}, invalidField("from", err)
		}
		return Generic(img), nil
	}
	return Recipe{}, badRequest("recipe", "want a recipe (%s) or an image URL in from", strings.Join(RecipeNames(), ", "))
}

// mirrored is recipe r from the node's mirror (r itself without one):
// its image and checksum list URLs checked by URLs as a build's URL is. A
// refused mirror is the node's configuration, not the request's.
func (s *Service) mirrored(ctx context.Context, r Recipe) (Recipe, error) {
	if s.o.Mirror == "" {
		return r, nil
	}
	m, err := MirrorRecipe(r, s.o.Mirror)
	if err != nil {
		return Recipe{}, fmt.Errorf("[templates] %w: %w", err, sandbox.ErrNotConfigured)
	}
	for _, u := range []string{m.Image.URL, m.Image.ChecksumURL} {
		if u == "" {
			continue
		}
		if err := s.o.URLs.Check(ctx, u); err != nil {
			return Recipe{}, fmt.Errorf("[templates] mirror: %w: %w", err, sandbox.ErrNotConfigured)
		}
	}
	return m, nil
}

// join answers the build of req's name that is queued or running: joined
// when it builds the same, ErrBuildConflict when not.
func (s *Service) join(req apitype.TemplateBuildRequest) (apitype.TemplateBuild, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.builds[req.Name]
	if !ok || !active(b.state) {
		return apitype.TemplateBuild{}, false, nil
	}
	if b.req != req {
		return apitype.TemplateBuild{}, false, fmt.Errorf("%w: a build of %q from %s is %s; wait for it (GET /v1/templates/builds/%s)",
			ErrBuildConflict, req.Name, sourceOf(b.req), b.state.State, req.Name)
	}
	st := b.snapshot()
	st.Joined = true
	return st, true, nil
}

// sourceOf names what a request builds from, without credentials or query.
func sourceOf(r apitype.TemplateBuildRequest) string {
	if r.Recipe != "" {
		return "recipe " + r.Recipe
	}
	return RedactURL(r.From)
}

// exists records and answers a template found on the node (built as
// the ledger's record rec says).
func (s *Service) exists(req apitype.TemplateBuildRequest, vmid int, rec Record) (apitype.TemplateBuild, error) {
	now := s.o.Now().UTC()
	st := apitype.TemplateBuild{Name: req.Name, Recipe: req.Recipe, From: RedactURL(req.From), State: apitype.BuildDone, VMID: vmid, Reused: true, Image: rec.Image, BuildMode: apitype.BuildMode(rec.Mode),
		Progress: []string{fmt.Sprintf("template %q is VM %d, built earlier, %s: reused", req.Name, vmid, rec.Mode)}, Started: now, Finished: &now}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.builds[req.Name]; ok && active(b.state) {
		// a build of the name started meanwhile: answer it
		out := b.snapshot()
		out.Joined = true
		return out, nil
	}
	s.rememberLocked(req.Name, &build{req: req, state: st})
	return st, nil
}

// launch registers a build of req and starts its goroutine.
func (s *Service) launch(req apitype.TemplateBuildRequest, recipe Recipe) (apitype.TemplateBuild, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, joined, err := s.registerLocked(req)
	if err != nil || b == nil {
		return joined, err
	}
	s.wg.Add(1)
	go s.run(s.ctx, b, recipe)
	return b.snapshot(), nil
}

// registerLocked adds a queued build of req, or answers the build of its
// name that is queued or running (joined; b nil). s.mu is held.
func (s *Service) registerLocked(req apitype.TemplateBuildRequest) (b *build, joined apitype.TemplateBuild, err error) {
	if b, ok := s.builds[req.Name]; ok && active(b.state) {
		if b.req != req {
			return nil, apitype.TemplateBuild{}, fmt.Errorf("%w: a build of %q from %s started meanwhile", ErrBuildConflict, req.Name, sourceOf(b.req))
		}
		out := b.snapshot()
		out.Joined = true
		return nil, out, nil
	}
	if s.ctx == nil {
		return nil, apitype.TemplateBuild{}, ErrNotRunning
	}
	n := 0
	for _, b := range s.builds {
		if active(b.state) {
			n++
		}
	}
	if n >= s.o.MaxBuilds {
		return nil, apitype.TemplateBuild{}, fmt.Errorf("%w: %d builds are queued or running; retry when one is done", ErrBuildsFull, n)
	}
	b = &build{req: req, state: apitype.TemplateBuild{Name: req.Name, Recipe: req.Recipe, From: RedactURL(req.From), BuildMode: req.BuildMode,
		State: apitype.BuildQueued, Progress: []string{}, Started: s.o.Now().UTC()}}
	s.finished = slices.DeleteFunc(s.finished, func(n string) bool { return n == req.Name })
	s.builds[req.Name] = b
	return b, apitype.TemplateBuild{}, nil
}

// rememberLocked stores a finished build, forgetting the oldest finished
// ones past Keep. s.mu is held.
func (s *Service) rememberLocked(name string, b *build) {
	s.builds[name] = b
	s.finished = slices.DeleteFunc(s.finished, func(n string) bool { return n == name })
	s.finished = append(s.finished, name)
	for len(s.finished) > s.o.Keep {
		delete(s.builds, s.finished[0])
		s.finished = s.finished[1:]
	}
}

// run waits for a build slot, builds, and records how it ended.
func (s *Service) run(ctx context.Context, b *build, recipe Recipe) {
	defer s.wg.Done()
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		s.end(b, Result{}, fmt.Errorf("not started: %w", ctx.Err()))
		return
	}
	defer func() { <-s.slots }()
	s.mu.Lock()
	b.state.State = apitype.BuildRunning
	s.mu.Unlock()
	res, err := s.build(ctx, b, recipe)
	s.end(b, res, err)
}

func (s *Service) build(ctx context.Context, b *build, recipe Recipe) (Result, error) {
	unlock, err := Lock(s.o.LockDir, b.req.Name)
	if err != nil {
		return Result{}, fmt.Errorf("%w (pve-inspectd template build on the node?)", err)
	}
	defer unlock()
	px, err := s.o.Login(ctx)
	if err != nil {
		return Result{}, loginError{err}
	}
	o := s.o.Defaults
	o.Name, o.Recipe, o.Mode, o.KeepCancelled, o.LockDir, o.room = b.req.Name, recipe, Mode(b.req.BuildMode), true, s.o.LockDir, s.room
	o.Progress = progressWriter{s: s, b: b}
	o.Log = s.o.Log
	bl, err := New(px, s.o.Agent, s.o.Host, o)
	if err != nil {
		return Result{}, err
	}
	res, err := bl.Run(ctx)
	if err != nil {
		return res, err
	}
	if err := s.grant(ctx, px, res.VMID); err != nil {
		return res, err
	}
	if s.o.Grant != nil {
		fmt.Fprintf(o.Progress, "%-8s the daemon's token may clone VM %d\n", "grant:", res.VMID)
	}
	return res, nil
}

// grant runs Grant (when set) for template vmid.
func (s *Service) grant(ctx context.Context, px Proxmox, vmid int) error {
	if s.o.Grant == nil {
		return nil
	}
	if err := s.o.Grant(ctx, px, vmid); err != nil {
		return fmt.Errorf("template is VM %d, but the daemon's token may not clone it: %w (as root: PVE_INSPECTD_TEMPLATES=\"... %d\" /usr/lib/pve-inspectd/pve-access-setup)", vmid, err, vmid)
	}
	return nil
}

// end records a build's end and publishes it.
func (s *Service) end(b *build, res Result, err error) {
	var rec Record
	if err == nil {
		// the image the template was built from and how, as the ledger
		// records them (read before the lock: a file); unread, the build
		// says none
		var rerr error
		if rec, rerr = s.recorded(res.VMID); rerr != nil {
			s.o.Log.Warn("template build: the image it was built from is unknown", "template", b.req.Name, "err", rerr)
		}
	}
	now := s.o.Now().UTC()
	ev := apitype.Event{Type: apitype.EventTemplateBuildDone, Template: b.req.Name, VMID: res.VMID}
	s.mu.Lock()
	b.state.Finished, b.state.VMID, b.state.Reused = &now, res.VMID, res.Reused
	if err != nil {
		msg := failureText(err)
		b.state.State, b.state.Error = apitype.BuildFailed, msg
		ev.Type, ev.Detail = apitype.EventTemplateBuildFailed, msg
	} else {
		b.state.State, b.state.Image = apitype.BuildDone, rec.Image
		ev.Detail = fmt.Sprintf("template %q is VM %d", b.req.Name, res.VMID)
		if b.req.ImportOnly {
			ev.Detail += ", imported without boot"
		}
		if res.Reused {
			ev.Detail += " (built earlier: reused)"
		}
	}
	s.rememberLocked(b.req.Name, b)
	s.mu.Unlock()
	// a template may have come (or gone): the next lookup looks again
	s.o.Catalog.Forget()
	if err != nil {
		s.o.Log.Warn("template build failed", "template", b.req.Name, "err", failureText(err))
	} else {
		s.o.Log.Info("template build done", "template", b.req.Name, "vmid", res.VMID, "reused", res.Reused)
	}
	s.o.Publish(ev)
}

// maxFailureText bounds a failed build's error in its state and event.
const maxFailureText = 2000

// reGotDigest is the digest Proxmox's checksum mismatch says it got: the
// digest of what the node fetched, which the build's caller is not told.
var reGotDigest = regexp.MustCompile(`got '[0-9A-Fa-f]+'`)

// failureText is err as a failed build's state and event say it: printable
// (a guest's agent errors are the guest's text), without the digest of
// what the node fetched, at most maxFailureText bytes.
func failureText(err error) string {
	msg := reGotDigest.ReplaceAllString(printable(err.Error()), "got '(digest withheld)'")
	if len(msg) > maxFailureText {
		msg = strings.ToValidUTF8(msg[:maxFailureText], "") + " ..."
	}
	return msg
}

// progressWriter turns a build's progress output into lines of its state
// and progress events.
type progressWriter struct {
	s *Service
	b *build
}

// maxLine bounds one progress line (a longer one is cut).
const maxLine = 1024

func (w progressWriter) Write(p []byte) (int, error) {
	var lines []string
	w.s.mu.Lock()
	w.b.partial = append(w.b.partial, p...)
	for {
		i := bytes.IndexByte(w.b.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.Join(strings.Fields(string(w.b.partial[:i])), " ")
		w.b.partial = w.b.partial[i+1:]
		if len(line) > maxLine {
			line = line[:maxLine] + "..."
		}
		lines = append(lines, line)
		st := &w.b.state
		st.Progress = append(st.Progress, line)
		if over := len(st.Progress) - apitype.MaxBuildProgress; over > 0 {
			st.Progress = slices.Delete(st.Progress, 0, over)
		}
	}
	if len(w.b.partial) > maxLine {
		w.b.partial = w.b.partial[:0]
	}
	w.s.mu.Unlock()
	for _, l := range lines {
		w.s.o.Publish(apitype.Event{Type: apitype.EventTemplateBuildProgress, Template: w.b.req.Name, Detail: l})
	}
	return len(p), nil
}
