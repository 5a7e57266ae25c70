package templatebuild_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// testOVA is a small OVA the emulator takes: box.ovf with ovf and a
// 4 GiB vmdk box-disk1.vmdk.
func testOVA(t *testing.T, ovf string) []byte {
	t.Helper()
	return tarOf(t, "box.ovf", []byte(ovf), "box-disk1.vmdk", vmdkHeader(4<<30))
}

// tarOf is a tar of the members given as name, data pairs.
func tarOf(t *testing.T, members ...any) []byte {
	t.Helper()
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for i := 0; i+1 < len(members); i += 2 {
		name, data := members[i].(string), members[i+1].([]byte)
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// uploadNode is a service node whose agent answers at once and whose
// local storage takes an OVA's extraction, with the test OVA and its
// upload as box.
func uploadNode(t *testing.T) (*serviceNode, []byte, apitype.TemplateUpload) {
	t.Helper()
	n := newServiceNode(t)
	close(n.agent.gate)
	n.s.SetStorageContent("local", "backup,iso,vztmpl,import,snippets,images")
	ova := testOVA(t, "<Envelope/>")
	h := sha256.Sum256(ova)
	u := apitype.TemplateUpload{Name: "box", File: "box.ova", SHA256: hex.EncodeToString(h[:]), OVADisk: "box-disk1.vmdk", Size: int64(len(ova))}
	return n, ova, u
}

// uploads counts the upload requests the emulator answered.
func (e emuNode) uploads() int {
	n := 0
	for _, r := range e.s.Requests() {
		if strings.HasSuffix(r.Path, "/upload") {
			n++
		}
	}
	return n
}

// bodyOf is an upload body over r (no slot to release).
func bodyOf(r io.Reader) templatebuild.UploadBody {
	return func() (io.Reader, func(), error) { return r, func() {}, nil }
}

// readCounter counts what is read of a body.
type readCounter struct {
	r *bytes.Reader
	n int
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestServiceUploadOVAOnEmulator: an OVA sent to the service is uploaded
// to the node under the build's name of its digest (a file another user
// planted under that name with other content is replaced, not taken),
// Proxmox verifies its sha256, and the build makes the template from its
// disk; a second upload of the name answers done and reused without
// reading its body or uploading; a body whose digest is not the one
// given fails naming sha256 and keeps nothing; bad fields change nothing.
func TestServiceUploadOVAOnEmulator(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum := u.SHA256
	u.SHA256 = strings.ToUpper(sum) // taken in either case

	for _, tt := range []struct {
		field string
		edit  func(*apitype.TemplateUpload)
	}{
		{"name", func(u *apitype.TemplateUpload) { u.Name = "bad_name" }},
		{"file", func(u *apitype.TemplateUpload) { u.File = "../box.ova" }},
		{"file", func(u *apitype.TemplateUpload) { u.File = "box.iso" }},
		{"sha256", func(u *apitype.TemplateUpload) { u.SHA256 = "abc" }},
		{"ova_disk", func(u *apitype.TemplateUpload) { u.OVADisk = "" }},
		{"ova_disk", func(u *apitype.TemplateUpload) { u.OVADisk = "../x.vmdk" }},
		{"size", func(u *apitype.TemplateUpload) { u.Size = 0 }},
		{"size", func(u *apitype.TemplateUpload) { u.Size = 21 << 30 }},
	} {
		bad := u
		tt.edit(&bad)
		_, err := n.svc.Upload(ctx, bad, bodyOf(bytes.NewReader(ova)))
		var inv *sandbox.InvalidError
		if !errors.As(err, &inv) || inv.Field != tt.field {
			t.Errorf("%+v: %v, want refused naming %s", bad, err, tt.field)
		}
	}
	if n.uploads() != 0 || len(n.vmsNamed(t, "box")) != 0 {
		t.Fatalf("refused requests uploaded (%d) or built", n.uploads())
	}

	// Another user's file under the build's own name, other content.
	stored := templatebuild.UploadFile("box.ova", sum)
	n.upload(t, stored, testOVA(t, "<Envelope>planted</Envelope>"))
	before := n.uploads()

	st, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova)))
	if err != nil || st.From != "upload:box.ova" || (st.State != apitype.BuildQueued && st.State != apitype.BuildRunning) {
		t.Fatalf("upload: %+v %v", st, err)
	}
	done := n.waitState(t, "box", apitype.BuildDone)
	out := strings.Join(done.Progress, "\n")
	for _, want := range []string{"with another digest", "replaced by the upload", "Proxmox verifies its sha256", "from local:import/" + stored + "/box-disk1.vmdk"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	if n.uploads() != before+1 {
		t.Errorf("%d uploads, want 1", n.uploads()-before)
	}
	conf, err := n.px.VMConfig(ctx, done.VMID)
	if err != nil || conf["template"] != "1" || !strings.Contains(conf["scsi0"], "size=4G") {
		t.Errorf("template config %v %v", conf, err)
	}

	body := &readCounter{r: bytes.NewReader(ova)}
	st, err = n.svc.Upload(ctx, u, bodyOf(body))
	if err != nil || st.State != apitype.BuildDone || !st.Reused || st.VMID != done.VMID {
		t.Errorf("second upload: %+v %v, want done and reused", st, err)
	}
	if body.n != 0 || n.uploads() != before+1 {
		t.Errorf("second upload read %d bytes, %d uploads", body.n, n.uploads()-before)
	}

	// A body that is not the digest's: Proxmox's check fails it.
	wrong := bytes.Clone(ova)
	wrong[len(wrong)-1] ^= 1
	_, err = n.svc.Upload(ctx, apitype.TemplateUpload{Name: "box3", File: "b3.ova", SHA256: sum, OVADisk: "box-disk1.vmdk", Size: int64(len(wrong))}, bodyOf(bytes.NewReader(wrong)))
	var inv *sandbox.InvalidError
	if !errors.As(err, &inv) || inv.Field != "sha256" || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Errorf("wrong body: %v, want refused naming sha256", err)
	}
	if st, ok := n.svc.Build("box3"); !ok || st.State != apitype.BuildFailed {
		t.Errorf("build after a wrong body: %+v %v, want failed", st, ok)
	}
	vols, err := n.px.StorageVolumes(ctx, "local", "import")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if strings.Contains(v.VolID, "b3.ova") {
			t.Errorf("a body of the wrong digest was kept: %s", v.VolID)
		}
	}
	// A short body fails the upload and keeps nothing.
	_, err = n.svc.Upload(ctx, apitype.TemplateUpload{Name: "box4", File: "b4.ova", SHA256: sum, OVADisk: "box-disk1.vmdk", Size: int64(len(ova)) + 10}, bodyOf(bytes.NewReader(ova)))
	if err == nil || !strings.Contains(err.Error(), "ended before its size") {
		t.Errorf("short body: %v", err)
	}
}

// TestServiceUploadJoinsAndConflicts: while an upload runs, the same
// upload joins it without reading its body, the same image for another
// template is a conflict (Proxmox's upload copies over the file in
// place), another source for the name is a conflict; the first upload
// then ends and its build is done.
func TestServiceUploadJoinsAndConflicts(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() {
		_, err := n.svc.Upload(ctx, u, bodyOf(pr))
		first <- err
	}()
	if _, err := pw.Write(ova[:100]); err != nil { // the upload reads: it runs
		t.Fatal(err)
	}
	body := &readCounter{r: bytes.NewReader(ova)}
	st, err := n.svc.Upload(ctx, u, bodyOf(body))
	if err != nil || !st.Joined || st.State != apitype.BuildRunning || body.n != 0 {
		t.Errorf("the same upload meanwhile: %+v %v (read %d bytes), want joined unread", st, err, body.n)
	}
	other := u
	other.Name = "box-b"
	if _, err := n.svc.Upload(ctx, other, bodyOf(bytes.NewReader(ova))); !errors.Is(err, templatebuild.ErrBuildConflict) || !strings.Contains(err.Error(), "being uploaded for another template") {
		t.Errorf("the same image for another template meanwhile: %v, want a conflict", err)
	}
	if _, err := n.svc.Start(ctx, n.fromURL("box")); !errors.Is(err, templatebuild.ErrBuildConflict) {
		t.Errorf("a URL build of the name meanwhile: %v, want a conflict", err)
	}
	if _, err := pw.Write(ova[100:]); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	if err := <-first; err != nil {
		t.Fatalf("first upload: %v", err)
	}
	n.waitState(t, "box", apitype.BuildDone)
	if n.uploads() != 1 {
		t.Errorf("%d uploads, want 1", n.uploads())
	}
}

// TestServiceUploadOfAnotherImageIsNoReuse: a template of the name that
// was built from another image (another digest) is not answered as the
// upload's template: the Python provider names an OVA's template by its
// file name and size only (ova-FILE-SIZE, the reference's tag), so two
// different OVAs of one name and size on two eval machines map to one
// name, and the second would silently run the first's system. The
// upload is a conflict naming both digests, its body unread; the same
// image is still reused.
func TestServiceUploadOfAnotherImageIsNoReuse(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	done := n.waitState(t, "box", apitype.BuildDone)

	other := testOVA(t, "<Envelope>other</Envelope>")
	h := sha256.Sum256(other)
	ou := u
	ou.SHA256, ou.Size = hex.EncodeToString(h[:]), int64(len(other))
	body := &readCounter{r: bytes.NewReader(other)}
	st, err := n.svc.Upload(ctx, ou, bodyOf(body))
	if !errors.Is(err, templatebuild.ErrBuildConflict) || !strings.Contains(err.Error(), u.SHA256) || !strings.Contains(err.Error(), ou.SHA256) {
		t.Errorf("another image for template box: %+v %v, want a conflict naming both digests", st, err)
	}
	if body.n != 0 || n.uploads() != 1 {
		t.Errorf("another image read %d bytes, %d uploads: want none read, one upload", body.n, n.uploads())
	}
	st, err = n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova)))
	if err != nil || !st.Reused || st.VMID != done.VMID {
		t.Errorf("the same image again: %+v %v, want reused", st, err)
	}
}

// TestServiceTemplateSaysItsImage: GET /v1/templates/builds/{name}
// (Service.Template) says what image a template was built from, so a
// client that finds the template by name (the Python provider's
// ova-FILE-SIZE) can tell another image of the name: the done build
// carries it, a daemon that remembers no build finds the template and
// its image in the build ledger, a record without an image says none,
// and a name without a template is no answer.
func TestServiceTemplateSaysItsImage(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	done := n.waitState(t, "box", apitype.BuildDone)
	want := "sha256:" + u.SHA256
	if done.Image != want {
		t.Errorf("done build's image %q, want %q", done.Image, want)
	}
	if st, ok, err := n.svc.Template(ctx, "box"); err != nil || !ok || st.Image != want {
		t.Errorf("template of the running daemon: %+v %v %v", st, ok, err)
	}

	// A daemon started since: nothing remembered, the ledger says (its
	// catalog looks at the node once per MaxAge).
	host := templatebuild.NodeHost{StateDir: n.ledger}
	clock := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cat, err := templatebuild.NewCatalog(templatebuild.CatalogOptions{List: n.px.ListVMs, Ledger: host, Now: clock.Now, MaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := templatebuild.NewService(templatebuild.ServiceOptions{
		Login: func(context.Context) (templatebuild.Proxmox, error) { return n.px, nil },
		Agent: n.agent, Host: host, Catalog: cat,
		Defaults: templatebuild.Options{Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0"},
		LockDir:  t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fresh.Build("box"); ok {
		t.Fatal("a new service remembers a build")
	}
	st, ok, err := fresh.Template(ctx, "box")
	if err != nil || !ok || st.State != apitype.BuildDone || !st.Reused || st.VMID != done.VMID || st.Image != want {
		t.Errorf("template found after a restart: %+v %v %v, want done, VM %d, image %s", st, ok, err, done.VMID, want)
	}
	if err := host.Record(done.VMID, templatebuild.Record{Name: "box", State: templatebuild.StateTemplate}); err != nil {
		t.Fatal(err)
	}
	before := len(n.s.Requests())
	if st, ok, err := fresh.Template(ctx, "box"); err != nil || !ok || st.Image != want {
		t.Errorf("template within the catalog's MaxAge: %+v %v %v, want the image it read", st, ok, err)
	}
	if asked := len(n.s.Requests()) - before; asked != 0 {
		t.Errorf("a GET within the catalog's MaxAge asked the node %d times", asked)
	}
	clock.Advance(2 * time.Minute)
	if st, ok, err := fresh.Template(ctx, "box"); err != nil || !ok || st.Image != "" {
		t.Errorf("template of a record without an image: %+v %v %v, want no image", st, ok, err)
	}
	if st, ok, err := fresh.Template(ctx, "none"); err != nil || ok {
		t.Errorf("no template of the name: %+v %v %v", st, ok, err)
	}
}

// TestServiceTemplateFailedBuildWhenNodeUnreachable: a remembered failed
// build is GET's answer when the node cannot be asked for a template of
// the name (its error is often why it failed), not a login error.
func TestServiceTemplateFailedBuildWhenNodeUnreachable(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var broken atomic.Bool
	svc, err := templatebuild.NewService(templatebuild.ServiceOptions{
		Login: func(context.Context) (templatebuild.Proxmox, error) {
			if broken.Load() {
				return nil, errors.New("login refused")
			}
			return n.px, nil
		},
		Agent: n.agent, Host: templatebuild.NodeHost{StateDir: n.ledger},
		Defaults: templatebuild.Options{Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0"},
		LockDir:  t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { defer close(ended); svc.Run(ctx) }()
	defer func() { cancel(); <-ended }()
	wrong := bytes.Clone(ova)
	wrong[len(wrong)-1] ^= 1
	if _, err := svc.Upload(ctx, u, bodyOf(bytes.NewReader(wrong))); err == nil {
		t.Fatal("a body that is not its digest was taken")
	}
	if st, ok := svc.Build(u.Name); !ok || st.State != apitype.BuildFailed {
		t.Fatalf("build after a wrong body: %+v %v, want failed", st, ok)
	}
	broken.Store(true)
	st, ok, err := svc.Template(ctx, u.Name)
	if err != nil || !ok || st.State != apitype.BuildFailed || st.Error == "" {
		t.Errorf("GET with the node unreachable: %+v %v %v, want the failed build with its error", st, ok, err)
	}
}

// TestServiceUploadNeedsRoom: an upload is refused before a byte of its
// body is read unless the image storage has twice its size free
// (pveproxy spools the body to /var/tmp, then Proxmox copies it into the
// storage): an error wrapping sandbox.ErrStorageFull (507
// insufficient-storage) naming the storage, the need and what is free;
// nothing is uploaded, and the same upload is taken once there is room.
func TestServiceUploadNeedsRoom(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	need := 2 * u.Size
	n.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: need - 1})
	body := &readCounter{r: bytes.NewReader(ova)}
	_, err := n.svc.Upload(ctx, u, bodyOf(body))
	if !errors.Is(err, sandbox.ErrStorageFull) {
		t.Fatalf("upload to a storage without room: %v, want ErrStorageFull", err)
	}
	for _, want := range []string{"image storage local", fmt.Sprintf("has %d bytes free", need-1), fmt.Sprintf("needs %d", need)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if body.n != 0 || n.uploads() != 0 {
		t.Errorf("a refused upload read %d bytes, sent %d uploads", body.n, n.uploads())
	}
	if st, ok := n.svc.Build(u.Name); !ok || st.State != apitype.BuildFailed || !strings.Contains(st.Error, "bytes free") {
		t.Errorf("the build after the refusal: %+v %v, want failed saying why", st, ok)
	}

	n.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: need})
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatalf("upload with room: %v", err)
	}
	n.waitState(t, u.Name, apitype.BuildDone)
	if n.uploads() != 1 {
		t.Errorf("%d uploads, want 1", n.uploads())
	}
}

// TestServiceUploadToInactiveStorage: an image storage that is not active
// on the node (its status' active 0: a mount or a server gone) is
// unavailable, not full: the upload is refused before a byte of its body
// is read with an error wrapping sandbox.ErrNotConfigured (the API's 503
// unavailable), not ErrStorageFull (507), naming the storage; the same
// upload is taken once the storage is active again.
func TestServiceUploadToInactiveStorage(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n.s.SetStorageSpace("local", pveemu.StorageSpace{Inactive: true})
	body := &readCounter{r: bytes.NewReader(ova)}
	_, err := n.svc.Upload(ctx, u, bodyOf(body))
	if !errors.Is(err, sandbox.ErrNotConfigured) || errors.Is(err, sandbox.ErrStorageFull) {
		t.Fatalf("upload to an inactive storage: %v, want unavailable (ErrNotConfigured), not full", err)
	}
	for _, want := range []string{"image storage local is unavailable", "not active"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "room") || strings.Contains(err.Error(), "free") {
		t.Errorf("refusal %q speaks of room", err)
	}
	if body.n != 0 || n.uploads() != 0 {
		t.Errorf("a refused upload read %d bytes, sent %d uploads", body.n, n.uploads())
	}
	n.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: 50 << 30})
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatalf("upload once the storage is active: %v", err)
	}
	n.waitState(t, u.Name, apitype.BuildDone)
}

// TestServiceUploadsInFlightHoldTheirRoom: the room an upload needs is
// held while it runs: two uploads of different images at once (the API
// takes two) that the image storage has room for only one of are not both
// taken because each alone fits: the second is refused (ErrStorageFull,
// naming what the uploads in flight hold) before its body is read, and
// taken once the first has ended.
func TestServiceUploadsInFlightHoldTheirRoom(t *testing.T) {
	n, ova, u := uploadNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ova2 := testOVA(t, "<Envelope><other/></Envelope>")
	h := sha256.Sum256(ova2)
	u2 := apitype.TemplateUpload{Name: "box-b", File: "box-b.ova", SHA256: hex.EncodeToString(h[:]), OVADisk: "box-disk1.vmdk", Size: int64(len(ova2))}
	// room for either upload at its peak, not for both
	n.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: 2*u.Size + 2*u2.Size - 1})

	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() {
		_, err := n.svc.Upload(ctx, u, bodyOf(pr))
		first <- err
	}()
	if _, err := pw.Write(ova[:100]); err != nil { // the first upload reads: its room was checked
		t.Fatal(err)
	}
	body := &readCounter{r: bytes.NewReader(ova2)}
	_, err := n.svc.Upload(ctx, u2, bodyOf(body))
	if !errors.Is(err, sandbox.ErrStorageFull) || !strings.Contains(err.Error(), "in flight") {
		t.Errorf("a second upload while the first holds the room: %v, want ErrStorageFull naming the uploads in flight", err)
	}
	if body.n != 0 {
		t.Errorf("the refused upload read %d bytes", body.n)
	}
	if _, err := pw.Write(ova[100:]); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	if err := <-first; err != nil {
		t.Fatalf("first upload: %v", err)
	}
	n.waitState(t, u.Name, apitype.BuildDone)
	// the first's room is given back when it ends
	if _, err := n.svc.Upload(ctx, u2, bodyOf(bytes.NewReader(ova2))); err != nil {
		t.Fatalf("the second upload once the first ended: %v", err)
	}
	n.waitState(t, u2.Name, apitype.BuildDone)
	if n.uploads() != 2 {
		t.Errorf("%d uploads, want 2", n.uploads())
	}
}
