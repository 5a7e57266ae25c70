package templatebuild_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// gatedAgent holds every command until the gate is closed (or the
// command's context ends): a build stays running while a test looks.
type gatedAgent struct {
	templatebuild.Agent
	gate chan struct{}
	// asked is closed at the first command.
	asked    chan struct{}
	askedOne sync.Once
}

func (g *gatedAgent) Exec(ctx context.Context, vmid int, argv []string, timeout time.Duration) (templatebuild.AgentResult, error) {
	g.askedOne.Do(func() { close(g.asked) })
	select {
	case <-g.gate:
	case <-ctx.Done():
		return templatebuild.AgentResult{}, ctx.Err()
	}
	if argv[0] == "sh" {
		// the fake guest has no shell: the checks and the seal pass
		argv = []string{"true"}
	}
	return g.Agent.Exec(ctx, vmid, argv, timeout)
}

// events collects published events.
type events struct {
	mu  sync.Mutex
	evs []apitype.Event
}

func (e *events) publish(ev apitype.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// wait returns the events of typ once there are at least n of them (or
// after a minute, what there are: the caller's assertion fails). A build's
// end is published after its state says it ended (outside the service's
// lock), so a test that saw the state waits for the event.
func (e *events) wait(t *testing.T, typ string, n int) []apitype.Event {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		evs := e.of(typ)
		if len(evs) >= n || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *events) of(typ string) []apitype.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []apitype.Event
	for _, ev := range e.evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// serviceNode is an emulator node with an image at
// http://images.example/images/cloud.raw (the URL guard resolves
// images.example to a TEST-NET-3 address; the node's downloads reach the
// image server whatever the address) and a build service on it.
type serviceNode struct {
	emuNode
	agent *gatedAgent
	ev    *events
	svc   *templatebuild.Service
	sum   string
	stop  context.CancelFunc
	ended chan struct{}
}

var testGuard = templatebuild.URLGuard{
	Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "images.example":
			return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
		case "metadata.example":
			return []netip.Addr{netip.MustParseAddr("203.0.113.11"), netip.MustParseAddr("169.254.169.254")}, nil
		case "node.example":
			return []netip.Addr{netip.MustParseAddr("192.0.2.5")}, nil
		}
		return nil, errors.New("no such host")
	},
	Own: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.5")}, nil },
}

func newServiceNode(t *testing.T) *serviceNode {
	t.Helper()
	return newServiceNodeWith(t, nil)
}

// newServiceNodeWith is newServiceNode with the service's options
// changed by mod first.
func newServiceNodeWith(t *testing.T, mod func(*templatebuild.ServiceOptions)) *serviceNode {
	t.Helper()
	img := bytes.Repeat([]byte("cloud-image "), 1<<14)
	sum := sha256.Sum256(img)
	e := newEmuNode(t, map[string][]byte{"/images/cloud.raw": img})
	return startServiceWith(t, e, "", "sha256:"+hex.EncodeToString(sum[:]), mod)
}

// startService runs a build service on e, its recipes from mirror (none
// when ""); sum is the digest of the node's test image.
func startService(t *testing.T, e emuNode, mirror, sum string) *serviceNode {
	t.Helper()
	return startServiceWith(t, e, mirror, sum, nil)
}

// startServiceWith is startService with the service's options changed by
// mod first.
func startServiceWith(t *testing.T, e emuNode, mirror, sum string, mod func(*templatebuild.ServiceOptions)) *serviceNode {
	t.Helper()
	n := &serviceNode{emuNode: e, agent: &gatedAgent{Agent: e.agent, gate: make(chan struct{}), asked: make(chan struct{})},
		ev: &events{}, sum: sum, ended: make(chan struct{})}
	o := templatebuild.ServiceOptions{
		Login: func(context.Context) (templatebuild.Proxmox, error) { return e.px, nil },
		Agent: n.agent, Host: templatebuild.NodeHost{HTTPClient: e.hc, StateDir: e.ledger}, URLs: testGuard, AllowURLs: true, Mirror: mirror,
		Defaults: templatebuild.Options{Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0",
			AgentWait: 30 * time.Second, AgentPoll: 20 * time.Millisecond},
		LockDir: t.TempDir(), Publish: n.ev.publish,
	}
	if mod != nil {
		mod(&o)
	}
	svc, err := templatebuild.NewService(o)
	if err != nil {
		t.Fatal(err)
	}
	n.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	go func() { defer close(n.ended); svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-n.ended })
	return n
}

// fromURL is a build of the test image. The fake guest runs true but
// no cloud-init nor the shipped recipes' checks: only a build from an
// image (the generic recipe, whose check the fake guest fails) is
// possible here, so its checks are those of the fake guest.
func (n *serviceNode) fromURL(name string) apitype.TemplateBuildRequest {
	return apitype.TemplateBuildRequest{Name: name, From: "http://images.example/images/cloud.raw", Checksum: n.sum}
}

// waitState polls the build of name until it is in state (or fails the
// test after a minute).
func (n *serviceNode) waitState(t *testing.T, name, state string) apitype.TemplateBuild {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, ok := n.svc.Build(name)
		if ok && st.State == state {
			return st
		}
		if ok && st.State == apitype.BuildFailed {
			t.Fatalf("build %q failed: %s\n%s", name, st.Error, strings.Join(st.Progress, "\n"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %q: %+v (known %v), want state %s", name, st, ok, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (n *serviceNode) vmsNamed(t *testing.T, name string) []sandbox.VMInfo {
	t.Helper()
	vms, err := n.px.ListVMs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(vms, func(v sandbox.VMInfo) bool { return v.Name != name })
}

// TestServiceRefusesBadRequests: every refused request names its field,
// and nothing is downloaded, created or remembered.
func TestServiceRefusesBadRequests(t *testing.T) {
	n := newServiceNode(t)
	ctx := context.Background()
	sum := n.sum
	for _, tc := range []struct {
		name  string
		req   apitype.TemplateBuildRequest
		field string
		says  string
	}{
		{"bad name", apitype.TemplateBuildRequest{Name: "no_underscores", Recipe: "debian13"}, "name", "DNS name"},
		{"no source", apitype.TemplateBuildRequest{Name: "t1"}, "recipe", "want a recipe"},
		{"both", apitype.TemplateBuildRequest{Name: "t1", Recipe: "debian13", From: "http://images.example/x.raw", Checksum: sum}, "from", "not both"},
		{"unknown recipe", apitype.TemplateBuildRequest{Name: "t1", Recipe: "centos"}, "recipe", "debian13, kali2025.4, ubuntu24.04"},
		{"kali with a checksum", apitype.TemplateBuildRequest{Name: "t1", Recipe: "kali2025.4", Checksum: sum}, "checksum", "a recipe pins its own"},
		{"recipe with checksum", apitype.TemplateBuildRequest{Name: "t1", Recipe: "debian13", Checksum: sum}, "checksum", "a recipe pins its own"},
		{"no checksum", apitype.TemplateBuildRequest{Name: "t1", From: "http://images.example/images/cloud.raw"}, "checksum", "needs its checksum"},
		{"bad checksum", apitype.TemplateBuildRequest{Name: "t1", From: "http://images.example/images/cloud.raw", Checksum: "md5:00"}, "from", "sha256:HEX"},
		{"volume", apitype.TemplateBuildRequest{Name: "t1", From: "local:import/cloud.raw", Checksum: sum}, "from", "--from STORAGE:import/FILE"},
		{"not an image", apitype.TemplateBuildRequest{Name: "t1", From: "http://images.example/x.iso", Checksum: sum}, "from", "not one Proxmox imports"},
		{"ftp", apitype.TemplateBuildRequest{Name: "t1", From: "ftp://images.example/x.raw", Checksum: sum}, "from", "want an http(s) URL"},
		{"loopback", apitype.TemplateBuildRequest{Name: "t1", From: "http://127.0.0.1:8006/x.raw", Checksum: sum}, "from", "loopback"},
		{"v6 loopback", apitype.TemplateBuildRequest{Name: "t1", From: "http://[::1]/x.raw", Checksum: sum}, "from", "loopback"},
		{"metadata address", apitype.TemplateBuildRequest{Name: "t1", From: "http://169.254.169.254/x.raw", Checksum: sum}, "from", "link-local"},
		{"metadata by name", apitype.TemplateBuildRequest{Name: "t1", From: "http://metadata.example/x.raw", Checksum: sum}, "from", "169.254.169.254"},
		{"alibaba", apitype.TemplateBuildRequest{Name: "t1", From: "http://100.100.100.200/x.raw", Checksum: sum}, "from", "metadata"},
		{"aws v6", apitype.TemplateBuildRequest{Name: "t1", From: "http://[fd00:ec2::254]/x.raw", Checksum: sum}, "from", "metadata"},
		{"own address", apitype.TemplateBuildRequest{Name: "t1", From: "http://node.example/x.raw", Checksum: sum}, "from", "node's own"},
		{"unspecified", apitype.TemplateBuildRequest{Name: "t1", From: "http://0.0.0.0/x.raw", Checksum: sum}, "from", "unspecified"},
		{"credentials", apitype.TemplateBuildRequest{Name: "t1", From: "http://u:secret@images.example/x.raw", Checksum: sum}, "from", "credentials"},
		{"unresolvable", apitype.TemplateBuildRequest{Name: "t1", From: "http://nowhere.example/x.raw", Checksum: sum}, "from", "resolve"},
		{"import-only URL", apitype.TemplateBuildRequest{Name: "t1", From: "http://images.example/images/cloud.raw", Checksum: sum, BuildMode: apitype.BuildMode{ImportOnly: true}}, "import_only", "import_only=true"},
		{"import-only recipe", apitype.TemplateBuildRequest{Name: "t1", Recipe: "debian13", BuildMode: apitype.BuildMode{ImportOnly: true}}, "import_only", "not a recipe or a URL"},
		{"disk bus", apitype.TemplateBuildRequest{Name: "t1", Recipe: "debian13", BuildMode: apitype.BuildMode{DiskBus: "ide"}}, "disk_bus", "--import-only"},
		{"os type", apitype.TemplateBuildRequest{Name: "t1", Recipe: "debian13", BuildMode: apitype.BuildMode{OSType: "win10"}}, "os_type", "--import-only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.svc.Start(ctx, tc.req)
			var ie *sandbox.InvalidError
			if !errors.As(err, &ie) || ie.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%+v: %v, want invalid %s saying %q", tc.req, err, tc.field, tc.says)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the refusal repeats the URL's password: %v", err)
			}
		})
	}
	if _, ok := n.svc.Build("t1"); ok {
		t.Error("a refused request left a build")
	}
	if n.downloads() != 0 || len(n.vmsNamed(t, "t1")) != 0 || len(n.ev.evs) != 0 {
		t.Errorf("refusals changed something: %d downloads, VMs %v, events %v", n.downloads(), n.vmsNamed(t, "t1"), n.ev.evs)
	}
}

// TestServiceBuildJoinReuse: a build from a URL runs in the service's
// goroutine; a second request of the same joins it, one of the name from
// another source is a conflict; it ends with a template and events
// (progress lines, done) of no owner; a request after it answers that the
// template exists, without a download.
func TestServiceBuildJoinReuse(t *testing.T) {
	n := newServiceNode(t)
	ctx := context.Background()
	req := n.fromURL("tpl1")
	st, err := n.svc.Start(ctx, req)
	if err != nil || st.Joined || (st.State != apitype.BuildQueued && st.State != apitype.BuildRunning) {
		t.Fatalf("start: %+v %v", st, err)
	}
	<-n.agent.asked // the VM exists and boots: the build holds
	again, err := n.svc.Start(ctx, req)
	if err != nil || !again.Joined || again.State != apitype.BuildRunning {
		t.Errorf("second request: %+v %v, want joined running", again, err)
	}
	other := req
	other.From = "http://images.example/images/other.raw"
	if _, err := n.svc.Start(ctx, other); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("another source for the name: %v, want a conflict", err)
	}
	close(n.agent.gate)
	done := n.waitState(t, "tpl1", apitype.BuildDone)
	if done.VMID == 0 || done.Reused || done.Error != "" || len(done.Progress) == 0 || done.Finished == nil {
		t.Errorf("done: %+v", done)
	}
	conf, err := n.px.VMConfig(ctx, done.VMID)
	if err != nil || conf["template"] != "1" || conf["name"] != "tpl1" || !strings.Contains(conf["tags"], templatebuild.TagTemplate) {
		t.Errorf("template %d: %v %v", done.VMID, conf, err)
	}
	prog := n.ev.of(apitype.EventTemplateBuildProgress)
	fin := n.ev.wait(t, apitype.EventTemplateBuildDone, 1)
	if len(prog) != len(done.Progress) || len(fin) != 1 || fin[0].VMID != done.VMID || fin[0].Template != "tpl1" {
		t.Errorf("events: %d progress (state has %d lines), done %+v", len(prog), len(done.Progress), fin)
	}
	for _, ev := range append(prog, fin...) {
		if ev.Owner != "" || ev.Sandbox != "" || ev.Template != "tpl1" {
			t.Errorf("event %+v: want the template's, of no owner", ev)
		}
	}
	if !slices.ContainsFunc(prog, func(ev apitype.Event) bool { return strings.Contains(ev.Detail, "Proxmox verifies its sha256") }) {
		t.Errorf("no progress event of the download: %+v", prog)
	}

	exists, err := n.svc.Start(ctx, req)
	if err != nil || exists.State != apitype.BuildDone || !exists.Reused || exists.VMID != done.VMID || n.downloads() != 1 {
		t.Errorf("request after the build: %+v %v, %d downloads", exists, err, n.downloads())
	}
}

// TestServiceStopsAtShutdown: a running build ends when the service's
// context does, Run returns, the build is recorded failed and its VM is
// left tagged building (the next build destroys it, and builds anew);
// a request after the end is refused as busy.
func TestServiceStopsAtShutdown(t *testing.T) {
	n := newServiceNode(t)
	ctx := context.Background()
	if _, err := n.svc.Start(ctx, n.fromURL("tpl2")); err != nil {
		t.Fatal(err)
	}
	<-n.agent.asked
	n.stop()
	select {
	case <-n.ended:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	st, _ := n.svc.Build("tpl2")
	if st.State != apitype.BuildFailed || !strings.Contains(st.Error, "context canceled") {
		t.Errorf("build after the shutdown: %+v", st)
	}
	if f := n.ev.wait(t, apitype.EventTemplateBuildFailed, 1); len(f) != 1 || f[0].Template != "tpl2" {
		t.Errorf("failed events: %+v", f)
	}
	left := n.vmsNamed(t, "tpl2")
	if len(left) != 1 || !slices.Contains(left[0].Tags, templatebuild.TagBuilding) {
		t.Errorf("VMs of the stopped build: %+v, want one tagged %s", left, templatebuild.TagBuilding)
	}
	if _, err := n.svc.Start(ctx, n.fromURL("tpl3")); !errors.Is(err, sandbox.ErrBusy) {
		t.Errorf("start after the end: %v, want busy", err)
	}
}

// TestServiceOneBuildAtATime: with one build slot, a build of another
// name waits (queued) while the first holds it, and runs once it is done.
func TestServiceOneBuildAtATime(t *testing.T) {
	n := newServiceNode(t)
	ctx := context.Background()
	if _, err := n.svc.Start(ctx, n.fromURL("tpl-a")); err != nil {
		t.Fatal(err)
	}
	<-n.agent.asked // tpl-a runs and holds the slot
	st, err := n.svc.Start(ctx, n.fromURL("tpl-b"))
	if err != nil || st.State != apitype.BuildQueued {
		t.Fatalf("second build: %+v %v, want queued", st, err)
	}
	if st, _ := n.svc.Build("tpl-b"); st.State != apitype.BuildQueued || len(n.vmsNamed(t, "tpl-b")) != 0 {
		t.Errorf("second build while the first runs: %+v, VMs %v", st, n.vmsNamed(t, "tpl-b"))
	}
	close(n.agent.gate)
	a := n.waitState(t, "tpl-a", apitype.BuildDone)
	b := n.waitState(t, "tpl-b", apitype.BuildDone)
	if a.VMID == b.VMID {
		t.Errorf("builds: %+v %+v", a, b)
	}
	// every line of tpl-b's came after tpl-a's end
	n.ev.mu.Lock()
	defer n.ev.mu.Unlock()
	aDone := slices.IndexFunc(n.ev.evs, func(ev apitype.Event) bool {
		return ev.Type == apitype.EventTemplateBuildDone && ev.Template == "tpl-a"
	})
	bFirst := slices.IndexFunc(n.ev.evs, func(ev apitype.Event) bool { return ev.Template == "tpl-b" })
	if aDone < 0 || bFirst < aDone {
		t.Errorf("tpl-a done at event %d, tpl-b's first event at %d: %+v", aDone, bFirst, n.ev.evs)
	}
}

// waitEnded polls the build of name until it is done or failed (or fails
// the test after a minute).
func (n *serviceNode) waitEnded(t *testing.T, name string) apitype.TemplateBuild {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if st, ok := n.svc.Build(name); ok && !slices.Contains([]string{apitype.BuildQueued, apitype.BuildRunning}, st.State) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %q never ended", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServiceTemplateFailedBuildOfAnExistingTemplate: a build that made
// its template and then failed (the daemon's token could not be granted
// it, so no sandbox can clone it) is answered failed with its error, not
// done: GET /v1/templates/builds/{name} said done here, from the
// template the ledger records, and hid the failure. A last progress line
// says the builds' template of the name exists; a new request answers it
// (done, reused) once the grant works, and GET says done again.
func TestServiceTemplateFailedBuildOfAnExistingTemplate(t *testing.T) {
	var grantFails atomic.Bool
	grantFails.Store(true)
	n := newServiceNodeWith(t, func(o *templatebuild.ServiceOptions) {
		o.Grant = func(context.Context, templatebuild.Proxmox, int) error {
			if grantFails.Load() {
				return errors.New("ACL update failed: permission denied")
			}
			return nil
		}
	})
	close(n.agent.gate)
	ctx := context.Background()
	req := n.fromURL("tpl-g")
	if _, err := n.svc.Start(ctx, req); err != nil {
		t.Fatal(err)
	}
	failed := n.waitEnded(t, "tpl-g")
	if failed.State != apitype.BuildFailed || !strings.Contains(failed.Error, "may not clone") || failed.VMID == 0 {
		t.Fatalf("build whose grant fails: %+v, want failed at the grant", failed)
	}
	if vms := n.vmsNamed(t, "tpl-g"); len(vms) != 1 || !vms[0].Template {
		t.Fatalf("VMs of the build: %+v, want its template", vms)
	}
	st, ok, err := n.svc.Template(ctx, "tpl-g")
	if err != nil || !ok || st.State != apitype.BuildFailed || st.Error != failed.Error {
		t.Fatalf("GET after the failed build: %+v %v %v, want it failed with its error", st, ok, err)
	}
	if last := st.Progress[len(st.Progress)-1]; !strings.Contains(last, fmt.Sprintf("exists as VM %d", failed.VMID)) || !strings.Contains(last, "built from "+n.sum) {
		t.Errorf("GET's last line %q does not say the builds' template exists", last)
	}
	if again, ok := n.svc.Build("tpl-g"); !ok || len(again.Progress) != len(failed.Progress) {
		t.Errorf("GET changed the remembered build: %+v", again)
	}

	grantFails.Store(false)
	st, err = n.svc.Start(ctx, req)
	if err != nil || st.State != apitype.BuildDone || !st.Reused || st.VMID != failed.VMID {
		t.Fatalf("request once the grant works: %+v %v, want the template done, reused", st, err)
	}
	if st, ok, err := n.svc.Template(ctx, "tpl-g"); err != nil || !ok || st.State != apitype.BuildDone {
		t.Errorf("GET after the reuse: %+v %v %v, want done", st, ok, err)
	}
}
