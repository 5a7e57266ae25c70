package templatebuild_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ulikunitz/xz"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// kaliDisk is the disk.raw of the test archives (600 KiB).
var kaliDisk = bytes.Repeat([]byte("kali-disk-raw "), 600<<10/14)

// kaliNode is an emulator whose image server is a mirror of kali2025.4
// (MIRROR/kali2025.4/<the archive> and its SHA256SUMS) serving archive,
// its list holding list's line (the archive's own digest when ""), and
// the shipped recipe from that mirror, with checks and a seal the
// emulator's fake guest runs.
func kaliNode(t *testing.T, archive []byte, list string) (emuNode, templatebuild.Recipe, map[string][]byte) {
	t.Helper()
	shipped := templatebuild.Recipes()["kali2025.4"]
	sum := sha256.Sum256(archive)
	if list == "" {
		list = hex.EncodeToString(sum[:]) + "  " + shipped.Image.Listed() + "\n"
	}
	files := map[string][]byte{"/m/kali2025.4/" + shipped.Image.Listed(): archive, "/m/kali2025.4/SHA256SUMS": []byte(list)}
	e := newEmuNode(t, files)
	r, err := templatebuild.MirrorRecipe(shipped, "http://images.example/m/")
	if err != nil {
		t.Fatal(err)
	}
	r.Checks, r.Seal = [][]string{{"true"}}, [][]string{{"true"}}
	return e, r, files
}

// calls counts the emulator's answered requests of method whose path ends
// with suffix.
func (e emuNode) calls(method, suffix string) int {
	n := 0
	for _, r := range e.s.Requests() {
		if r.Method == method && strings.HasSuffix(r.Path, suffix) && r.Status == http.StatusOK {
			n++
		}
	}
	return n
}

// importVolumes are the volume ids of local's import content.
func (e emuNode) importVolumes(t *testing.T) []string {
	t.Helper()
	vols, err := e.px.StorageVolumes(context.Background(), "local", "import")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vols {
		out = append(out, v.VolID)
	}
	return out
}

// volumeData reads volid's file on the node.
func (e emuNode) volumeData(t *testing.T, volid string) []byte {
	t.Helper()
	p, err := e.px.VolumePath(context.Background(), volid)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBuildKaliOnEmulator: the kali2025.4 recipe, from a mirror, on the
// emulator: the build downloads the .tar.xz itself, uploads its disk.raw
// (content import, under the build's name of the archive's digest), checks
// the archive's digest against the list's line, and builds the template
// from the upload. A second run reuses the template; another template
// reuses the uploaded volume after hashing it on the node, without a
// second upload; a volume replaced on the storage under the build's name
// is unpacked and uploaded again, never taken.
func TestBuildKaliOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	archive := templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "./", Type: tar.TypeDir}, templatebuild.TarMember{Name: "./disk.raw", Data: kaliDisk})
	sum := sha256.Sum256(archive)
	e, r, _ := kaliNode(t, archive, "")
	res, out, err := e.build(t, ctx, "kali", r)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	volid := "local:import/" + templatebuild.BuildFile(r.Image.URL, "kali-2025.4-genericcloud-amd64.raw", hex.EncodeToString(sum[:]))
	for _, want := range []string{
		"sha256 of kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz from http://images.example/m/kali2025.4/SHA256SUMS",
		"downloading http://images.example/m/kali2025.4/kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz",
		"unpacking disk.raw (" + strconv.Itoa(len(kaliDisk)) + " bytes) and uploading it to " + volid,
		"50%: ", "uploaded disk.raw",
		"has sha256 " + hex.EncodeToString(sum[:]) + ", as its checksum says",
		"VM 100 \"kali\" from " + volid,
		"tagged builtin-kali2025.4;inspect;pvei-template",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	if vols := e.importVolumes(t); !slices.Equal(vols, []string{volid}) {
		t.Errorf("import volumes %v, want %s", vols, volid)
	}
	if !bytes.Equal(e.volumeData(t, volid), kaliDisk) {
		t.Error("the uploaded volume is not the archive's disk.raw")
	}
	conf, err := e.px.VMConfig(ctx, res.VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["template"] != "1" || conf["tags"] != "builtin-kali2025.4;inspect;pvei-template" {
		t.Errorf("template config %v", conf)
	}

	if again, out, err := e.build(t, ctx, "kali", r); err != nil || !again.Reused || e.calls("POST", "/upload") != 1 {
		t.Errorf("second run: %+v %v, %d uploads\n%s", again, err, e.calls("POST", "/upload"), out)
	}
	// another template: the volume is hashed on the node and taken
	other, out, err := e.build(t, ctx, "kali-b", r)
	if err != nil || other.Reused || e.calls("POST", "/upload") != 1 || !strings.Contains(out, "as unpacked from the archive by an earlier build") {
		t.Errorf("a build from the volume on the node: %+v %v, %d uploads\n%s", other, err, e.calls("POST", "/upload"), out)
	}
	// a user who may upload import files replaces it under the build's name
	_, file, _ := strings.Cut(volid, ":import/")
	e.upload(t, file, bytes.Repeat([]byte{0x66}, 4096))
	third, out, err := e.build(t, ctx, "kali-c", r)
	if err != nil || third.Reused || e.calls("POST", "/upload") != 3 || !strings.Contains(out, "not the "+sha256Hex(kaliDisk)+" it was unpacked with: unpacked again") {
		t.Errorf("a build after the volume was replaced: %+v %v, %d uploads\n%s", third, err, e.calls("POST", "/upload"), out)
	}
	if !bytes.Equal(e.volumeData(t, volid), kaliDisk) {
		t.Error("the replaced volume was not uploaded again")
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestBuildKaliRefusedOnEmulator: an archive a hostile or broken mirror
// serves fails the build, with nothing left on the node: what is refused
// before disk.raw is reached uploads nothing; what is refused after its
// upload (a hostile member after it, a truncated stream's end, a digest
// that is not the list's) frees the uploaded volume (DELETE
// .../content/{volume}). The build's bound refuses a larger archive before
// anything is read and a larger disk.raw before it is uploaded.
func TestBuildKaliRefusedOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	disk := templatebuild.TarMember{Name: "disk.raw", Data: kaliDisk}
	good := templatebuild.TarXZ(t, xz.WriterConfig{}, disk)
	listed := templatebuild.Recipes()["kali2025.4"].Image.Listed()
	for _, tc := range []struct {
		name    string
		archive []byte
		list    string
		max     int64
		wantErr string
		freed   bool
	}{
		{name: "a symlink named disk.raw", archive: templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "disk.raw", Type: tar.TypeSymlink, Link: "/etc/pve/priv/authkey.key"}), wantErr: "a link, device or fifo"},
		{name: "../disk.raw", archive: templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "../disk.raw", Data: kaliDisk}), wantErr: `a member "../disk.raw" outside the archive's directory`},
		{name: "no disk.raw", archive: templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "disk.qcow2", Data: kaliDisk}), wantErr: `it holds no "disk.raw"`},
		{name: "a hostile member after it", archive: templatebuild.TarXZ(t, xz.WriterConfig{}, disk, templatebuild.TarMember{Name: "/etc/cron.d/x", Data: []byte("* * * * * root sh")}), wantErr: "outside", freed: true},
		{name: "truncated in disk.raw", archive: good[:len(good)/2], wantErr: "image archive refused"},
		{name: "truncated at its end", archive: good[:len(good)-16], wantErr: "image archive refused: its end", freed: true},
		{name: "a wrong digest", archive: good, list: strings.Repeat("0", 64) + "  " + listed + "\n",
			wantErr: "the archive has sha256 " + sha256Hex(good) + ", want " + strings.Repeat("0", 64) + " (its checksum): its disk is not kept", freed: true},
		{name: "no line in the list", archive: good, list: strings.Repeat("0", 64) + "  other.tar.xz\n", wantErr: "no line for " + listed},
		{name: "disk.raw over the bound", archive: good, max: int64(len(good)) + 1024, wantErr: `"disk.raw" is ` + strconv.Itoa(len(kaliDisk)) + " bytes: want 1 to " + strconv.Itoa(len(good)+1024) + " (--max-unpacked-gib, [templates] max_unpacked_gib)"},
		{name: "the archive over the bound", archive: good, max: int64(len(good)) - 1, wantErr: "more than the " + strconv.Itoa(len(good)-1) + " an archive may have"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, r, _ := kaliNode(t, tc.archive, tc.list)
			_, out, err := e.buildWith(t, ctx, templatebuild.Options{Name: "kali", Recipe: r, MaxUnpacked: tc.max})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%v, want %q\n%s", err, tc.wantErr, out)
			}
			if vols := e.importVolumes(t); len(vols) != 0 {
				t.Errorf("left on the node: %v", vols)
			}
			if n := e.calls("DELETE", ""); (n == 1) != tc.freed || n > 1 {
				t.Errorf("%d volume deletes, want the upload freed %v\n%s", n, tc.freed, out)
			}
			vms, err := e.px.ListVMs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(vms) != 0 {
				t.Errorf("VMs left: %+v", vms)
			}
		})
	}
}

// TestBuildKaliNeedsRoom: disk.raw's size is the archive's header, and a
// sparse member costs the archive nothing (GNU tar's 224-byte archive of
// a 4 MiB disk here; one of a disk of max_unpacked_gib, 64 GiB, is as
// small): the build sends it to Proxmox's upload, which spools it to
// /var/tmp and copies it into the storage, only when the image storage
// has room for it twice, as an upload over the API is; else it fails
// (sandbox.ErrStorageFull, naming the need) with nothing sent.
func TestBuildKaliNeedsRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	archive, err := os.ReadFile("testdata/unpack/sparse-gnu.tar.xz")
	if err != nil {
		t.Fatal(err)
	}
	const disk = 4 << 20
	e, r, _ := kaliNode(t, archive, "")
	e.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: 2*disk - 1})
	_, out, err := e.buildWith(t, ctx, templatebuild.Options{Name: "kali", Recipe: r})
	if !errors.Is(err, sandbox.ErrStorageFull) || !strings.Contains(err.Error(), "needs "+strconv.Itoa(2*disk)) {
		t.Errorf("a %d-byte disk.raw to a storage with %d bytes free: %v, want ErrStorageFull naming the need\n%s", disk, 2*disk-1, err, out)
	}
	if n := e.calls("POST", "/upload"); n != 0 {
		t.Errorf("%d uploads sent to a storage without room", n)
	}
	if vols := e.importVolumes(t); len(vols) != 0 {
		t.Errorf("left on the node: %v", vols)
	}
	e.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: 2 * disk})
	if _, out, err := e.buildWith(t, ctx, templatebuild.Options{Name: "kali", Recipe: r}); err != nil || e.calls("POST", "/upload") != 1 {
		t.Errorf("the build with room: %v, %d uploads\n%s", err, e.calls("POST", "/upload"), out)
	}
}

// TestServiceKaliRoomBesideUploads: over the API the archive's upload of
// a kali2025.4 build and the image uploads (PUT .../image) count the
// room they hold on the image storage together: while an upload holds
// room that leaves too little for disk.raw twice, the build fails for
// want of room (naming the uploads in flight) with nothing sent, though
// the storage alone would fit either.
func TestServiceKaliRoomBesideUploads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	archive := templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "disk.raw", Data: kaliDisk})
	e, _, _ := kaliNode(t, archive, "")
	n := startService(t, e, "http://images.example/m/", "")
	ova := testOVA(t, "<Envelope/>")
	u := apitype.TemplateUpload{Name: "box", File: "box.ova", SHA256: sha256Hex(ova), OVADisk: "box-disk1.vmdk", Size: int64(len(ova))}
	e.s.SetStorageSpace("local", pveemu.StorageSpace{Total: 100 << 30, Avail: 2*u.Size + 2*int64(len(kaliDisk)) - 1})
	pr, pw := io.Pipe()
	uploaded := make(chan error, 1)
	go func() {
		_, err := n.svc.Upload(ctx, u, bodyOf(pr))
		uploaded <- err
	}()
	if _, err := pw.Write(ova[:100]); err != nil { // the upload reads: its room is held
		t.Fatal(err)
	}
	if _, err := n.svc.Start(ctx, apitype.TemplateBuildRequest{Name: "kali", Recipe: "kali2025.4"}); err != nil {
		t.Fatal(err)
	}
	// failed, or past its upload (the agent of its VM asked: the gated
	// agent holds it there)
	var st apitype.TemplateBuild
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, _ = n.svc.Build("kali"); st.State == apitype.BuildFailed || st.State == apitype.BuildDone || isClosed(n.agent.asked) {
			break
		}
	}
	if st.State != apitype.BuildFailed || !strings.Contains(st.Error, "held by the uploads to it in flight") {
		t.Errorf("a kali build while an upload holds the room: %s %q, want failed for want of room\n%s", st.State, st.Error, strings.Join(st.Progress, "\n"))
	}
	if got := e.calls("POST", "/upload"); got != 0 {
		t.Errorf("%d uploads answered while the first is held", got)
	}
	if _, err := pw.Write(ova[100:]); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	if err := <-uploaded; err != nil {
		t.Fatalf("the upload: %v", err)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// stalledKali is a kali node whose recipe's archive (4 MiB of disk.raw)
// comes, with --checksum instead of a list, from another server than the
// mirror, which sends the first part of it (of len/part bytes) and then
// nothing until the request ends; ended is closed then.
func stalledKali(t *testing.T, part int) (e emuNode, r templatebuild.Recipe, archive []byte, ended <-chan struct{}) {
	t.Helper()
	archive = templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "disk.raw", Data: randomish(4 << 20)})
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(archive)))
		_, _ = w.Write(archive[:len(archive)/part])
		w.(http.Flusher).Flush()
		<-req.Context().Done()
		close(done)
	}))
	t.Cleanup(srv.Close)
	e, r, _ = kaliNode(t, archive, "")
	e.hc = srv.Client()
	r.Image.URL, r.Image.ChecksumURL, r.Image.Checksum = srv.URL+"/"+path.Base(r.Image.URL), "", "sha256:"+sha256Hex(archive)
	return e, r, archive, done
}

// leftNothing fails the test unless the archive's download ended (its
// server saw its request end) and the node holds no import volume and no
// VM.
func (e emuNode) leftNothing(t *testing.T, ended <-chan struct{}) {
	t.Helper()
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the download's request never ended")
	}
	if vols := e.importVolumes(t); len(vols) != 0 {
		t.Errorf("left on the node: %v", vols)
	}
	if vms, err := e.px.ListVMs(context.Background()); err != nil || len(vms) != 0 {
		t.Errorf("VMs %+v %v", vms, err)
	}
}

// TestBuildKaliCancelled: the build's context ending while disk.raw is
// uploaded (the archive's server sent half of it and waits) stops the
// download (the server sees its request end) and the upload, and leaves
// nothing on the node. The archive here comes from another server than
// the mirror, with --checksum instead of a list.
func TestBuildKaliCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, r, _, ended := stalledKali(t, 2)
	// cancelled once a tenth of disk.raw went to the upload
	var once sync.Once
	progress := writerFunc(func(p []byte) (int, error) {
		if bytes.Contains(p, []byte("10%: ")) {
			once.Do(cancel)
		}
		return len(p), nil
	})
	_, out, err := e.buildWith(t, ctx, templatebuild.Options{Name: "kali", Recipe: r, Progress: progress})
	if err == nil || !strings.Contains(err.Error(), "context canceled") || !strings.Contains(out, "10%: ") {
		t.Fatalf("a build cancelled in its upload: %v\n%s", err, out)
	}
	e.leftNothing(t, ended)
}

// writerFunc is an io.Writer calling f.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// randomish is n bytes that xz does not shrink much (an LCG's).
func randomish(n int) []byte {
	b := make([]byte, n)
	x := uint32(37)
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// TestServiceBuildsKali: over the API (POST /v1/templates/build
// {"recipe":"kali2025.4"}) the node builds kali2025.4 as it builds the
// other recipes: from the node's mirror (its URLs past the URL guard),
// the archive downloaded, unpacked and uploaded by the build itself, the
// VM created from the upload and booted (here its agent is held and the
// build stopped there).
func TestServiceBuildsKali(t *testing.T) {
	ctx := context.Background()
	archive := templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "disk.raw", Data: kaliDisk})
	e, _, _ := kaliNode(t, archive, "")
	n := startService(t, e, "http://images.example/m/", "")
	st, err := n.svc.Start(ctx, apitype.TemplateBuildRequest{Name: "kali", Recipe: "kali2025.4"})
	if err != nil || (st.State != apitype.BuildQueued && st.State != apitype.BuildRunning) {
		t.Fatalf("start: %+v %v", st, err)
	}
	select {
	case <-n.agent.asked:
	case <-time.After(time.Minute):
		st, _ := n.svc.Build("kali")
		t.Fatalf("the build VM's agent was never asked: %+v", st)
	}
	st, _ = n.svc.Build("kali")
	progress := strings.Join(st.Progress, "\n")
	volid := "local:import/" + templatebuild.BuildFile("", "kali-2025.4-genericcloud-amd64.raw", sha256Hex(archive))
	for _, want := range []string{"downloading http://images.example/m/kali2025.4/kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz",
		"uploaded disk.raw", "as its checksum says", "create: VM 100 \"kali\" from " + volid} {
		if !strings.Contains(progress, want) {
			t.Errorf("progress lacks %q:\n%s", want, progress)
		}
	}
	if vols := e.importVolumes(t); !slices.Equal(vols, []string{volid}) {
		t.Errorf("import volumes %v, want %s", vols, volid)
	}
}

// TestBuildKaliImageLocked: while another build unpacks the same archive
// (it holds the image's lock in the lock directory, as the CLI and the
// daemon share it), a build of another name is refused at once, saying
// so, with nothing uploaded: Proxmox's upload writes the file in place,
// so two at once would each hash the other's half.
func TestBuildKaliImageLocked(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	archive := templatebuild.TarXZ(t, xz.WriterConfig{}, templatebuild.TarMember{Name: "disk.raw", Data: kaliDisk})
	e, r, _ := kaliNode(t, archive, "")
	locks := t.TempDir()
	f, err := lockImageFile(t, locks, r, archive)
	if err != nil {
		t.Fatal(err)
	}
	_, out, err := e.buildWith(t, ctx, templatebuild.Options{Name: "kali-b", Recipe: r, LockDir: locks})
	if err == nil || !strings.Contains(err.Error(), "another build unpacks it now") || e.calls("POST", "/upload") != 0 {
		t.Fatalf("a build while the image is being unpacked: %v, %d uploads\n%s", err, e.calls("POST", "/upload"), out)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if _, out, err := e.buildWith(t, ctx, templatebuild.Options{Name: "kali-b", Recipe: r, LockDir: locks}); err != nil {
		t.Errorf("the build once the lock is free: %v\n%s", err, out)
	}
}

// lockImageFile takes, as another build would, the lock of unpacking the
// archive of recipe r in locks (the image's lock file, opened and closed
// with the test): an error when another holds it.
func lockImageFile(t *testing.T, locks string, r templatebuild.Recipe, archive []byte) (*os.File, error) {
	t.Helper()
	file := templatebuild.BuildFile("", r.Image.File, sha256Hex(archive))
	f, err := os.OpenFile(filepath.Join(locks, "image-"+file+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
