package templatebuild_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

const emuRootPassword = "build-root-pw"

// emuNode is the emulator with root's client, its agent sockets and an
// image server.
type emuNode struct {
	s      *pveemu.Server
	px     *pveapi.Client
	agent  apiAgent
	images *httptest.Server
	// hc is the node's own HTTP client (NodeHost's): every host it asks
	// for is the image server, as the bed's uplink serves any name.
	hc *http.Client
	// ledger is the build ledger's directory.
	ledger string
}

// apiAgent runs commands through the emulator's Proxmox agent API
// (agent/exec, agent/exec-status) as root: the emulator's fake guests
// speak qemu-ga's commands, not the full protocol this project's qga
// client checks (ids on every reply); that client meets real qemu-ga on
// the bed.
type apiAgent struct {
	hc           *http.Client
	base         string
	ticket, csrf string
}

func (a apiAgent) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("CSRFPreventionToken", a.csrf)
	req.AddCookie(&http.Cookie{Name: "PVEAuthCookie", Value: a.ticket})
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s %s", method, path, resp.Status, b)
	}
	return json.Unmarshal(b, &struct{ Data any }{Data: out})
}

// Exec implements templatebuild.Agent.
func (a apiAgent) Exec(ctx context.Context, vmid int, argv []string, timeout time.Duration) (templatebuild.AgentResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var started struct {
		PID int `json:"pid"`
	}
	if err := a.do(ctx, "POST", fmt.Sprintf("/nodes/pve/qemu/%d/agent/exec", vmid), map[string]any{"command": argv}, &started); err != nil {
		return templatebuild.AgentResult{}, err
	}
	for {
		var st struct {
			Exited   int    `json:"exited"`
			ExitCode int    `json:"exitcode"`
			Out      string `json:"out-data"`
			Err      string `json:"err-data"`
		}
		if err := a.do(ctx, "GET", fmt.Sprintf("/nodes/pve/qemu/%d/agent/exec-status?pid=%d", vmid, started.PID), nil, &st); err != nil {
			return templatebuild.AgentResult{}, err
		}
		if st.Exited == 1 {
			return templatebuild.AgentResult{Exit: st.ExitCode, Output: st.Out + st.Err}, nil
		}
		select {
		case <-ctx.Done():
			return templatebuild.AgentResult{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// imagesBackend is the fake backend whose node reaches every address it
// downloads from at the image server (as the bed's uplink serves any
// name): a URL may name a host the test's URL guard resolves.
type imagesBackend struct {
	*pveemu.FakeBackend
	images string
}

// DialContext implements pveemu.NodeDialer.
func (b imagesBackend) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, b.images)
}

func newEmuNode(t *testing.T, files map[string][]byte) emuNode {
	t.Helper()
	return newEmuNodeServing(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
}

// newEmuNodeServing is newEmuNode whose image server serves with serve.
func newEmuNodeServing(t *testing.T, serve http.Handler) emuNode {
	t.Helper()
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	images := httptest.NewServer(serve)
	t.Cleanup(images.Close)
	fb := imagesBackend{FakeBackend: pveemu.NewFakeBackend(run), images: images.Listener.Addr().String()}
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), StatsInterval: -1, RootPassword: emuRootPassword})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = fb.Close() })
	s.SetStorageContent("local", "backup,iso,vztmpl,import,snippets")
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	px, err := pveapi.NewWithPassword(pveapi.Options{URL: ts.URL + "/api2/json", Node: "pve", HTTPClient: ts.Client(), TaskPoll: 5 * time.Millisecond}, "root@pam", emuRootPassword)
	if err != nil {
		t.Fatal(err)
	}
	// The build's NIC: a vnet (the fake backend's only bridges).
	ctx := context.Background()
	if err := px.CreateZone(ctx, sandbox.ZoneSpec{ID: "bz"}); err != nil {
		t.Fatal(err)
	}
	if err := px.CreateVNet(ctx, sandbox.VNetSpec{ID: "bzv0", Zone: "bz"}); err != nil {
		t.Fatal(err)
	}
	if err := px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "bzv0", CIDR: "10.77.0.0/24", Gateway: "10.77.0.1", SNAT: true, DHCPRanges: []apitype.DHCPRange{{Start: "10.77.0.50", End: "10.77.0.99"}}}); err != nil {
		t.Fatal(err)
	}
	if err := px.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
	ticket, csrf := s.RootTicket()
	return emuNode{s: s, px: px, agent: apiAgent{hc: ts.Client(), base: ts.URL + "/api2/json", ticket: ticket, csrf: csrf}, images: images,
		hc: &http.Client{Transport: &http.Transport{DialContext: fb.DialContext}}, ledger: filepath.Join(dir, "ledger")}
}

func (e emuNode) build(t *testing.T, ctx context.Context, name string, r templatebuild.Recipe) (templatebuild.Result, string, error) {
	t.Helper()
	return e.buildWith(t, ctx, templatebuild.Options{Name: name, Recipe: r})
}

// buildWith builds with o's name, recipe and MaxUnpacked, LockDir and
// Timeout (when set) on the emulator's storages and vnet; its progress
// goes to o.Progress too.
func (e emuNode) buildWith(t *testing.T, ctx context.Context, o templatebuild.Options) (templatebuild.Result, string, error) {
	t.Helper()
	var out bytes.Buffer
	var progress io.Writer = &out
	if o.Progress != nil {
		progress = io.MultiWriter(&out, o.Progress)
	}
	b, err := templatebuild.New(e.px, e.agent, templatebuild.NodeHost{HTTPClient: e.hc, StateDir: e.ledger},
		templatebuild.Options{Name: o.Name, Recipe: o.Recipe, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0",
			AgentWait: 30 * time.Second, AgentPoll: 20 * time.Millisecond, MaxUnpacked: o.MaxUnpacked, LockDir: o.LockDir, Timeout: o.Timeout, Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(ctx)
	return res, out.String(), err
}

// downloads counts the download-url requests the emulator answered.
func (e emuNode) downloads() int {
	n := 0
	for _, r := range e.s.Requests() {
		if strings.HasSuffix(r.Path, "/download-url") {
			n++
		}
	}
	return n
}

// TestBuildOnEmulator: a build against the emulator (Proxmox's checks of
// download-url, import-from, the cloud-init drive and cicustom's snippets)
// gives a hardened template, tagged, without the build's drive and NIC;
// a second run reuses it without a download; the template clones and
// its clone's guest agent answers; a wrong checksum fails in Proxmox's
// download task and creates nothing.
func TestBuildOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img := bytes.Repeat([]byte("cloud-image "), 1<<16)
	sum := sha256.Sum256(img)
	e := newEmuNode(t, map[string][]byte{
		"/images/cloud.raw":  img,
		"/images/SHA256SUMS": []byte(hex.EncodeToString(sum[:]) + "  cloud.raw\n" + strings.Repeat("0", 64) + "  other.raw\n"),
	})
	r := templatebuild.Generic(templatebuild.Image{URL: e.images.URL + "/images/cloud.raw", File: "cloud.raw", ChecksumURL: e.images.URL + "/images/SHA256SUMS", ChecksumAlg: "sha256"})
	r.Name = "emu"
	// The fake guest runs only echo, cat, true and false: no cloud-init
	// (exit 127: the checks decide) and a check it can run.
	r.Checks = [][]string{{"true"}}
	r.Seal = [][]string{{"true"}}
	res, out, err := e.build(t, ctx, "tb1", r)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, want := range []string{"sha256 of cloud.raw from", "Proxmox verifies its sha256", "the image has no cloud-init; the checks decide", "tagged builtin-emu;inspect;pvei-template"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	conf, err := e.px.VMConfig(ctx, res.VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["template"] != "1" || conf["name"] != "tb1" || conf["tags"] != "builtin-emu;inspect;pvei-template" {
		t.Errorf("template config %v", conf)
	}
	for _, k := range []string{"ide2", "cicustom", "net0"} {
		if v, ok := conf[k]; ok {
			t.Errorf("template keeps %s=%s", k, v)
		}
	}
	if rep := hardening.Check(conf); !rep.OK() {
		t.Errorf("template not hardened: %v", rep.Failed())
	}
	if !strings.Contains(conf["scsi0"], "local-lvm:base-") {
		t.Errorf("disk %q: want a base image on local-lvm", conf["scsi0"])
	}
	// The image is downloaded under the build's name of its digest.
	volid := "local:import/" + templatebuild.BuildFile(r.Image.URL, "cloud.raw", hex.EncodeToString(sum[:]))
	vols, err := e.px.StorageVolumes(ctx, "local", "import")
	if err != nil || len(vols) != 1 || vols[0].VolID != volid {
		t.Errorf("import volumes %+v %v", vols, err)
	}
	sc, err := e.px.Storage(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := sc.Dir("snippets")
	if left, _ := filepath.Glob(filepath.Join(dir, "pvei-build-*")); len(left) > 0 {
		t.Errorf("snippets left: %v", left)
	}

	again, out, err := e.build(t, ctx, "tb1", r)
	if err != nil || !again.Reused || again.VMID != res.VMID || e.downloads() != 1 {
		t.Errorf("second run: %+v %v, %d downloads\n%s", again, err, e.downloads(), out)
	}

	// Another template from the same image: the volume on the node is
	// hashed there (its path from Proxmox) and kept.
	third, out, err := e.build(t, ctx, "tb3", r)
	if err != nil || third.Reused || !strings.Contains(out, volid+": sha256 "+hex.EncodeToString(sum[:])) || e.downloads() != 1 {
		t.Errorf("build from the image on the node: %+v %v, %d downloads\n%s", third, err, e.downloads(), out)
	}

	if err := e.px.CloneVM(ctx, sandbox.CloneSpec{Template: res.VMID, NewID: 500, Name: "clone"}); err != nil {
		t.Fatal(err)
	}
	if err := e.px.StartVM(ctx, 500); err != nil {
		t.Fatal(err)
	}
	ares, err := e.agent.Exec(ctx, 500, []string{"echo", "hi"}, 10*time.Second)
	if err != nil || ares.Exit != 0 || ares.Output != "hi\n" {
		t.Errorf("clone's agent: %+v %v", ares, err)
	}

	bad := r
	bad.Image.ChecksumURL, bad.Image.Checksum = "", "sha256:"+strings.Repeat("0", 64)
	bad.Image.URL, bad.Image.File = e.images.URL+"/images/cloud.raw?x", "other.raw"
	_, out, err = e.build(t, ctx, "tb2", bad)
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Errorf("wrong checksum: %v\n%s", err, out)
	}
	vms, err := e.px.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(vms, func(v sandbox.VMInfo) bool { return v.Name == "tb2" }) {
		t.Errorf("a failed download left a VM: %+v", vms)
	}
}

// vmdkHeader is a monolithic sparse vmdk header of size bytes (the
// emulator reads its magic, version and capacity as qemu-img would).
func vmdkHeader(size uint64) []byte {
	b := make([]byte, 1024)
	copy(b, "KDMV")
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint64(b[12:], size/512)
	return b
}

// TestBuildOVAOnEmulator: an OVA from --from URL with --checksum and
// --ova-disk is downloaded whole (Proxmox checks it has an .ovf) and its
// disk imported from STORAGE:import/FILE.ova/DISK.
func TestBuildOVAOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ova := tarOf(t, "noble.ovf", []byte("<Envelope/>"), "noble-disk.vmdk", vmdkHeader(8<<30))
	sum := sha256.Sum256(ova)
	e := newEmuNode(t, map[string][]byte{"/images/noble.ova": ova})
	// qemu-server extracts the disk on the OVA's storage: it needs images.
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import,snippets,images")
	img, err := templatebuild.ImageFromURL(e.images.URL+"/images/noble.ova", "sha256:"+hex.EncodeToString(sum[:]), "noble-disk.vmdk")
	if err != nil {
		t.Fatal(err)
	}
	r := templatebuild.Generic(img)
	r.Checks, r.Seal = [][]string{{"true"}}, [][]string{{"true"}}
	res, out, err := e.build(t, ctx, "ova1", r)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if !strings.Contains(out, "from local:import/"+templatebuild.BuildFile(img.URL, "noble.ova", hex.EncodeToString(sum[:]))+"/noble-disk.vmdk") {
		t.Errorf("progress:\n%s", out)
	}
	conf, err := e.px.VMConfig(ctx, res.VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["template"] != "1" || !strings.Contains(conf["scsi0"], "size=8G") {
		t.Errorf("template config %v", conf)
	}
}
