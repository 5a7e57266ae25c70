package templatebuild_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TestBuildAfterUpstreamRelease: the recipes download latest/ and
// current/ images whose file name stays while the distribution publishes
// new ones. download-url never replaces an existing file (pve-common
// Tools.pm download_file_from_url: an existing file with another checksum
// fails the task "checksum mismatch: ... aborting"), so the build
// downloads each release under a name of its digest (BuildFile): the
// build after the next release downloads the new image beside the old.
func TestBuildAfterUpstreamRelease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list := func(img []byte) []byte {
		sum := sha256.Sum256(img)
		return []byte(hex.EncodeToString(sum[:]) + "  cloud.raw\n")
	}
	v1 := bytes.Repeat([]byte("release-1 "), 1<<16)
	files := map[string][]byte{"/images/cloud.raw": v1, "/images/SHA256SUMS": list(v1)}
	e := newEmuNode(t, files)
	r := cloudRawRecipe(e)
	if _, out, err := e.build(t, ctx, "rel1", r); err != nil {
		t.Fatalf("first build: %v\n%s", err, out)
	}
	// The distribution publishes release 2 under the same name.
	v2 := bytes.Repeat([]byte("release-2 "), 1<<16)
	files["/images/cloud.raw"], files["/images/SHA256SUMS"] = v2, list(v2)
	if _, out, err := e.build(t, ctx, "rel2", r); err != nil {
		t.Errorf("a build after the image's next release: %v\n%s", err, out)
	}
}

// swapHost is NodeHost whose Checksum, once it has hashed the image,
// lets another user of the node upload a file of the same name (pve-storage
// Status.pm upload: Datastore.AllocateTemplate on the storage, content
// import, "we simply overwrite the destination file if it already
// exists").
type swapHost struct {
	templatebuild.NodeHost
	swap func()
}

func (h swapHost) Checksum(path, alg string) (string, error) {
	sum, err := h.NodeHost.Checksum(path, alg)
	h.swap()
	return sum, err
}

// upload posts data as import/name to the emulator's local storage.
func (e emuNode) upload(t *testing.T, name string, data []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("content", "import")
	fw, err := mw.CreateFormFile("filename", name)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write(data)
	_ = mw.Close()
	req, err := http.NewRequest("POST", e.agent.base+"/nodes/pve/storage/local/upload", &buf)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("CSRFPreventionToken", e.agent.csrf)
	req.AddCookie(&http.Cookie{Name: "PVEAuthCookie", Value: e.agent.ticket})
	resp, err := e.agent.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ans struct{ Data string }
	err = json.NewDecoder(resp.Body).Decode(&ans)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload: %s %v", resp.Status, err)
	}
	if st, err := e.s.WaitTask(context.Background(), ans.Data); err != nil || st != "OK" {
		t.Fatalf("upload task: %s %v", st, err)
	}
}

// TestBuildImageReplacedBeforeImport: the image on the node is hashed
// (image step), then imported by the create's task seconds to minutes
// later by its name. A user with Datastore.AllocateTemplate on the image
// storage (the right to upload ISOs) may overwrite the file in between,
// even under the build's own name (pve-storage Status.pm upload "simply
// overwrite[s]"): the build hashes it again after the import, and a
// changed file fails the build and destroys its VM. Here the swapped
// image is 3 MiB, the verified one 768 KiB.
func TestBuildImageReplacedBeforeImport(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, r, sum := cloudRawNode(t)
	if _, out, err := e.build(t, ctx, "first", r); err != nil {
		t.Fatalf("first build: %v\n%s", err, out)
	}
	evil := bytes.Repeat([]byte{0x66}, 3<<20)
	file := templatebuild.BuildFile(r.Image.URL, "cloud.raw", sum)
	host := swapHost{NodeHost: templatebuild.NodeHost{HTTPClient: e.images.Client(), StateDir: e.ledger}, swap: func() { e.upload(t, file, evil) }}
	var out bytes.Buffer
	b, err := templatebuild.New(e.px, e.agent, host, templatebuild.Options{Name: "second", Recipe: r, Storage: "local-lvm", ImageStorage: "local",
		SnippetStorage: "local", Bridge: "bzv0", AgentWait: 30 * time.Second, AgentPoll: 20 * time.Millisecond, Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "changed while it was imported") {
		conf, _ := e.px.VMConfig(ctx, res.VMID)
		t.Fatalf("build from a file replaced after its check: %v, template %d scsi0 %s\n%s", err, res.VMID, conf["scsi0"], out.String())
	}
	vms, err := e.px.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if v.Name == "second" {
			t.Errorf("the VM of the replaced image is left: %+v", v)
		}
	}
}

// cloudRawNode is an emulator serving a raw image cloud.raw (768 KiB)
// and its SHA256SUMS, the recipe of it (cloudRawRecipe) and its digest.
func cloudRawNode(t *testing.T) (emuNode, templatebuild.Recipe, string) {
	t.Helper()
	img := bytes.Repeat([]byte("cloud-image "), 1<<16)
	sum := sha256.Sum256(img)
	e := newEmuNode(t, map[string][]byte{"/images/cloud.raw": img, "/images/SHA256SUMS": []byte(hex.EncodeToString(sum[:]) + "  cloud.raw\n")})
	return e, cloudRawRecipe(e), hex.EncodeToString(sum[:])
}

// cloudRawRecipe builds e's cloud.raw, verified against its SHA256SUMS,
// with checks and a seal the emulator's fake guest runs.
func cloudRawRecipe(e emuNode) templatebuild.Recipe {
	r := templatebuild.Generic(templatebuild.Image{URL: e.images.URL + "/images/cloud.raw", File: "cloud.raw", ChecksumURL: e.images.URL + "/images/SHA256SUMS", ChecksumAlg: "sha256"})
	r.Name = "emu"
	r.Checks, r.Seal = [][]string{{"true"}}, [][]string{{"true"}}
	return r
}
