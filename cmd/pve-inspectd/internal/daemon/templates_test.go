package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

func TestReadBuilderPassword(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, body string
		mode       os.FileMode
		want, err  string
	}{
		{"root only", "pw-1\n", 0o600, "pw-1", ""},
		{"read only", "pw-2", 0o400, "pw-2", ""},
		{"group may read", "pw-3\n", 0o640, "", "mode 0640: only root may read it (chmod 600"},
		{"others may read", "pw-4\n", 0o644, "", "mode 0644"},
		{"empty", "\n", 0o600, "", "is empty"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
		if err := os.WriteFile(p, []byte(c.body), c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		got, err := ReadBuilderPassword(p)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %q %v, want an error with %q", c.name, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: %q %v, want %q", c.name, got, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), strings.TrimSpace(c.body)) && strings.TrimSpace(c.body) != "" {
			t.Errorf("%s: the error repeats the password: %v", c.name, err)
		}
	}
	if _, err := ReadBuilderPassword(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

// okAgent is a guest agent whose every command exits 0 (the build's
// guest steps are templatebuild's tests'; here the daemon's wiring is).
type okAgent struct{}

func (okAgent) Exec(context.Context, int, []string, time.Duration) (templatebuild.AgentResult, error) {
	return templatebuild.AgentResult{}, nil
}

// imageDialer is the fake backend whose node reaches every download
// address at the image server.
type imageDialer struct {
	*pveemu.FakeBackend
	images string
}

func (b imageDialer) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, b.images)
}

// TestAPITemplateBuilds: with [templates] build on, the daemon's API
// builds a template from a URL on the emulator with the builder's
// password (never its sandbox token), serves its state and events, and
// refuses to build once the password file is readable by others; Run
// stops the service.
func TestAPITemplateBuilds(t *testing.T) {
	img := bytes.Repeat([]byte("image "), 1<<12)
	sum := sha256.Sum256(img)
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(img) }))
	t.Cleanup(images.Close)
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	_ = os.MkdirAll(run, 0o755)
	const rootPW = "builder-root-pw"
	fb := imageDialer{FakeBackend: pveemu.NewFakeBackend(run), images: images.Listener.Addr().String()}
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), RootPassword: rootPW, StatsInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close(); _ = fb.Close() })
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{})
	if err != nil {
		t.Fatal(err)
	}
	emu.SetStorageContent("local", "backup,iso,vztmpl,import,snippets")
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	root, err := pveapi.NewWithPassword(pveapi.Options{URL: ts.URL + "/api2/json", Node: "pve", TaskPoll: 5 * time.Millisecond}, "root@pam", rootPW)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := root.CreateZone(ctx, sandbox.ZoneSpec{ID: "bz"}); err != nil {
		t.Fatal(err)
	}
	if err := root.CreateVNet(ctx, sandbox.VNetSpec{ID: "bzv0", Zone: "bz"}); err != nil {
		t.Fatal(err)
	}
	if err := root.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "bzv0", CIDR: "10.77.0.0/24", Gateway: "10.77.0.1", SNAT: true, DHCPRanges: []apitype.DHCPRange{{Start: "10.77.0.50", End: "10.77.0.99"}}}); err != nil {
		t.Fatal(err)
	}
	if err := root.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}

	bed := &pveBed{addr: strings.TrimPrefix(ts.URL, "http://"), emu: emu, ts: ts, id: id, secret: secret, run: run}
	cfg := bed.config(t, dir)
	pwFile := filepath.Join(dir, "builder-pw")
	if err := os.WriteFile(pwFile, []byte(rootPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Templates.Build, cfg.Templates.BuilderPasswordFile, cfg.Templates.Bridge = true, pwFile, "bzv0"
	cfg.Templates.AllowURLs = true
	cfg.Templates.LockDir = filepath.Join(dir, "locks")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	guard := templatebuild.URLGuard{Resolve: func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
	}}
	var logs bytes.Buffer
	api, err := NewAPI(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), APIDeps{
		Guests: apitest.NewGuests().Dial, RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		BuildAgent: okAgent{}, BuildURLs: &guard, BuildAgentPoll: 10 * time.Millisecond,
		BuildHost:      templatebuild.NodeHost{StateDir: filepath.Join(dir, "ledger")},
		BuilderProxmox: func(o pveapi.Options) pveapi.Options { o.TaskPoll = 5 * time.Millisecond; return o },
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- api.Run(rctx) }()
	c := client.NewUnix(cfg.API.Socket)
	waitFor(t, "healthy, with template builds", func() error {
		h, err := c.Health(ctx)
		if err == nil && !h.TemplateBuilds {
			err = errors.New("no template_builds in healthz")
		}
		return err
	})

	req := apitype.TemplateBuildRequest{Name: "img1", From: "http://images.example/img1.raw", Checksum: "sha256:" + hex.EncodeToString(sum[:])}
	if _, err := c.BuildTemplate(ctx, req); err != nil {
		t.Fatal(err)
	}
	var st apitype.TemplateBuild
	waitFor(t, "the build done", func() error {
		st, err = c.TemplateBuild(ctx, "img1")
		if err == nil && st.State == apitype.BuildFailed {
			t.Fatalf("build failed: %s\n%s", st.Error, strings.Join(st.Progress, "\n"))
		}
		if err == nil && st.State != apitype.BuildDone {
			err = fmt.Errorf("%s %s", st.State, st.Error)
		}
		return err
	})
	if conf, err := root.VMConfig(ctx, st.VMID); err != nil || conf["template"] != "1" || conf["name"] != "img1" {
		t.Errorf("template %d: %v %v", st.VMID, conf, err)
	}
	// The daemon's token may clone it: a create of it validates.
	rep, err := c.Validate(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "img1"}}})
	if err != nil || !rep.Valid {
		t.Errorf("validate a create of the built template: %+v %v", rep, err)
	}
	// Any token may ask what it was built from: the daemon's catalog (its
	// token's list of VMs, the ledger), made to look again by the build's end.
	if ti, err := c.Template(ctx, "img1"); err != nil || ti.VMID != st.VMID || !ti.Built || ti.Image != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("GET /v1/templates/img1: %+v %v, want VM %d built from sha256:%x", ti, err, st.VMID, sum)
	}
	if !strings.Contains(strings.Join(st.Progress, "\n"), fmt.Sprintf("grant: the daemon's token may clone VM %d", st.VMID)) {
		t.Errorf("progress: %q", st.Progress)
	}
	// Who made it: root@pam's ticket, not the daemon's token.
	var byRoot, byToken int
	for _, r := range emu.Requests() {
		if strings.HasSuffix(r.Path, "/download-url") || strings.HasSuffix(r.Path, "/template") {
			if r.AuthID == "root@pam" {
				byRoot++
			} else {
				byToken++
			}
		}
	}
	if byRoot != 2 || byToken != 0 {
		t.Errorf("download and conversion: %d by root@pam, %d by others", byRoot, byToken)
	}
	ectx, ecancel := context.WithTimeout(ctx, time.Minute)
	stop := errors.New("stop")
	err = c.Events(ectx, client.EventsRequest{Resume: true, Types: []string{apitype.EventTemplateBuildDone}}, func(ev apitype.Event) error {
		if ev.Template == "img1" && ev.VMID == st.VMID {
			return stop
		}
		return nil
	})
	ecancel()
	if !errors.Is(err, stop) {
		t.Errorf("no template.build.done event of img1: %v", err)
	}

	// An image sent over the API: streamed to the node by root@pam's
	// ticket, built, then reused without its body.
	up := apitype.TemplateUpload{Name: "up1", File: "up1.raw", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(img))}
	if st, err := c.UploadTemplate(ctx, up, bytes.NewReader(img)); err != nil || st.From != "upload:up1.raw" {
		t.Fatalf("upload: %+v %v", st, err)
	}
	waitFor(t, "the upload's build done", func() error {
		st, err = c.TemplateBuild(ctx, "up1")
		if err == nil && st.State == apitype.BuildFailed {
			t.Fatalf("build failed: %s\n%s", st.Error, strings.Join(st.Progress, "\n"))
		}
		if err == nil && st.State != apitype.BuildDone {
			err = fmt.Errorf("%s %s", st.State, st.Error)
		}
		return err
	})
	var uploads []string
	for _, r := range emu.Requests() {
		if strings.HasSuffix(r.Path, "/upload") {
			uploads = append(uploads, r.AuthID)
		}
	}
	if len(uploads) != 1 || uploads[0] != "root@pam" {
		t.Errorf("uploads by %q, want one by root@pam", uploads)
	}
	if again, err := c.UploadTemplate(ctx, up, bytes.NewReader(img)); err != nil || !again.Reused || again.VMID != st.VMID {
		t.Errorf("second upload: %+v %v, want reused", again, err)
	}
	n := 0
	for _, r := range emu.Requests() {
		if strings.HasSuffix(r.Path, "/upload") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d uploads to the node after the second request, want 1", n)
	}
	// An image storage that is not active: unavailable (503), naming it,
	// not insufficient-storage (507); nothing sent.
	emu.SetStorageSpace("local", pveemu.StorageSpace{Inactive: true})
	up2 := up
	up2.Name, up2.File = "up2", "up2.raw"
	_, err = c.UploadTemplate(ctx, up2, bytes.NewReader(img))
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Status != http.StatusServiceUnavailable || p.Type != apitype.ProblemUnavailable ||
		!strings.Contains(err.Error(), "unavailable: the image storage local is unavailable: it is not active on the node") {
		t.Errorf("upload to an inactive image storage: %v, want 503 unavailable naming local", err)
	}
	emu.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: 50 << 30})

	// A password file others may read: the next build fails saying so.
	if err := os.Chmod(pwFile, 0o644); err != nil {
		t.Fatal(err)
	}
	req.Name = "img2"
	if _, err := c.BuildTemplate(ctx, req); !client.IsProblem(err, apitype.ProblemUnavailable) || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("build with a readable password file: %v", err)
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), rootPW) {
		t.Error("the builder's password is in the daemon's log")
	}
}
