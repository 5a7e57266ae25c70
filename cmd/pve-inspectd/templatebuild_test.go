package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TestTemplateBuildArgs: bad input is refused before the configuration is
// read or anything is called; good input gets as far as the configuration
// (here a missing file, so nothing after it runs).
func TestTemplateBuildArgs(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "absent.toml")
	sha := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"t1"}, "want --recipe or --from"},
		{[]string{"t1", "--recipe", "fedora"}, `--recipe "fedora": unknown; shipped: debian13, kali2025.4, ubuntu24.04`},
		{[]string{"t_1", "--recipe", "debian13"}, "want a DNS name"},
		{[]string{"t1", "--recipe", "debian13", "--checksum", "sha256:00"}, "--checksum: checksum \"sha256:00\": sha256 wants 64 hex digits"},
		{[]string{"t1", "--recipe", "debian13", "--ova-disk", "d.vmdk"}, "--ova-disk goes with --from URL"},
		{[]string{"t1", "--recipe", "kali2025.4", "--max-unpacked-gib", "0"}, "--max-unpacked-gib 0: want 1 to 1024"},
		{[]string{"t1", "--recipe", "debian13", "--build-timeout", "5m"}, "--build-timeout 5m0s: want 30m0s to 168h0m0s"},
		{[]string{"t1", "--recipe", "debian13", "--build-timeout", "1h"}, "want more than the first boot's waits"},
		{[]string{"t1", "--recipe", "debian13", "--build-timeout", "2h", "--agent-wait", "2h"}, "want more than the first boot's waits"},
		{[]string{"t1", "--from", "https://h/x.qcow2", "--checksum", "sha256:zz"}, "wants 64 hex digits"},
		{[]string{"t1", "--from", "https://h/x.tar.xz"}, "not one Proxmox imports"},
		{[]string{"t1", "--from", "https://h/x.ova"}, "--ova-disk"},
		{[]string{"t1", "--from", "local:import/x.qcow2", "--checksum", sha}, "go with --from URL"},
		{[]string{"t1", "--from", "local:images/x.qcow2"}, "STORAGE:import/FILE"},
		{[]string{"t1", "--from", "local:import/x.ova"}, "names the disk"},
		{[]string{"t1", "--recipe", "debian13", "--storage", "a b"}, `--storage "a b"`},
		{[]string{"t1", "--recipe", "debian13", "--build-cidr", "10.0.0.1/24"}, "--build-cidr"},
		{[]string{"t1", "--recipe", "ubuntu24.04", "--work-storage", "a/b"}, `--work-storage "a/b"`},
		{[]string{"t1", "t2", "--recipe", "debian13"}, "accepts 1 arg"},
		{[]string{"t1", "--from", "https://h/x.ova", "--import-only"}, "--import-only builds from a volume on the node"},
		{[]string{"t1", "--from", "local:import/x.ova/d.vmdk", "--import-only"}, "an import-only build takes a volume STORAGE:import/FILE"},
		{[]string{"t1", "--from", "local:import/x.ova", "--import-only", "--disk-bus", "virtio"}, `--disk-bus: "virtio": want scsi`},
		{[]string{"t1", "--from", "local:import/x.ova", "--import-only", "--os-type", "solaris"}, `--os-type: "solaris"`},
		{[]string{"t1", "--from", "local:import/x.ova", "--import-only", "--ova-disk", "d.vmdk"}, "do not go with --import-only"},
		{[]string{"t1", "--from", "local:import/x.qcow2", "--disk-bus", "ide"}, "goes with an import-only build"},
		{[]string{"t1", "--recipe", "debian13", "--import-only"}, "need the image booted"},
		{[]string{"t1", "--recipe", "debian13", "--mirror", "ftp://m/images/"}, "want an http or https URL"},
		{[]string{"t1", "--recipe", "debian13", "--mirror", "http://u:p@m/images/"}, "carries credentials"},
		{[]string{"t1", "--recipe", "debian13", "--mirror", "http://m/images/?k=v"}, "query"},
		{[]string{"t1", "--recipe", "debian13", "--mirror", "http://169.254.169.254/images/"}, "link-local"},
		{[]string{"t1", "--from", "https://h/x.ova", "--ova-disk", "d.vmdk", "--checksum", sha, "--mirror", "http://m/"}, "--mirror goes with --recipe alone"},
		// Valid: they reach the configuration.
		{[]string{"t1", "--recipe", "debian13"}, "absent.toml"},
		{[]string{"t1", "--recipe", "kali2025.4"}, "absent.toml"},
		{[]string{"t1", "--recipe", "kali2025.4", "--checksum", sha, "--max-unpacked-gib", "16"}, "absent.toml"},
		{[]string{"t1", "--recipe", "debian13", "--checksum", sha}, "absent.toml"},
		{[]string{"t1", "--recipe", "kali2025.4", "--from", "local:import/k.raw"}, "absent.toml"},
		{[]string{"t1", "--from", "https://h/x.ova", "--ova-disk", "d.vmdk", "--checksum", sha}, "absent.toml"},
		{[]string{"t1", "--from", "local:import/u.ova/d.vmdk"}, "absent.toml"},
		{[]string{"t1", "--from", "local:import/u.ova", "--import-only", "--disk-bus", "ide"}, "absent.toml"},
		{[]string{"t1", "--from", "local:import/u.raw", "--import-only", "--disk-bus", "sata", "--os-type", "win11"}, "absent.toml"},
		{[]string{"t1", "--recipe", "ubuntu24.04", "--mirror", "https://mirror.example/cloud"}, "absent.toml"},
		{[]string{"t1", "--recipe", "ubuntu24.04", "--build-timeout", "12h"}, "absent.toml"},
	} {
		root := newRootCmd()
		root.SetArgs(append([]string{"-c", cfg, "template", "build"}, tc.args...))
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&bytes.Buffer{})
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.wantErr)
		}
		if out.Len() > 0 && !strings.Contains(out.String(), "Usage") {
			t.Errorf("%q printed %q", tc.args, out.String())
		}
	}
}

// TestTemplateBuildViaAPI: --via-api posts the build to the daemon's
// socket and prints its progress lines once each until it is done; a
// failed build is the command's error; flags that are the daemon's say
// are refused before anything is asked. --upload FILE sends the file
// with its sha256 and follows the build the same way.
func TestTemplateBuildViaAPI(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "pvei-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	var (
		mu    sync.Mutex
		posts []apitype.TemplateBuildRequest
		puts  []string
		looks int
		fail  bool
	)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		st := apitype.TemplateBuild{Name: "d13", State: apitype.BuildRunning, Progress: []string{"image: downloading"}}
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/templates/build":
			var req apitype.TemplateBuildRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			posts = append(posts, req)
			w.WriteHeader(http.StatusAccepted)
		case r.Method == "PUT" && r.URL.Path == "/v1/templates/build/d13/image":
			body, _ := io.ReadAll(r.Body)
			sum := sha256.Sum256(body)
			puts = append(puts, fmt.Sprintf("%s %d %d %x", r.URL.RawQuery, r.ContentLength, len(body), sum))
			w.WriteHeader(http.StatusAccepted)
		case r.Method == "GET" && r.URL.Path == "/v1/templates/builds/d13":
			looks++
			st.Progress = append(st.Progress, "create: VM 100")
			if looks > 1 {
				st.Progress = append(st.Progress, "done: template")
				st.State, st.VMID = apitype.BuildDone, 100
				if fail {
					st.State, st.Error = apitype.BuildFailed, "boot: no agent"
				}
			}
		default:
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("[node]\nid = \"pve\"\n[api]\nsocket = \""+sock+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		root := newRootCmd()
		root.SetArgs(append([]string{"-c", cfg, "template", "build"}, args...))
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&bytes.Buffer{})
		err := root.ExecuteContext(context.Background())
		return out.String(), err
	}
	asked := func() []apitype.TemplateBuildRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]apitype.TemplateBuildRequest(nil), posts...)
	}
	for _, flag := range [][]string{{"--bridge", "vmbr1"}, {"--mirror", "http://mirror.lan/cloud/"}, {"--state-dir", "/var/lib/other"}} {
		args := append([]string{"d13", "--recipe", "debian13", "--via-api"}, flag...)
		if _, err := run(args...); err == nil || !strings.Contains(err.Error(), flag[0]+" with --via-api") || len(asked()) != 0 {
			t.Errorf("%s with --via-api: %v (%d posts)", flag[0], err, len(asked()))
		}
	}
	out, err := run("d13", "--recipe", "debian13", "--via-api", "--poll", "10ms")
	if p := asked(); err != nil || len(p) != 1 || p[0] != (apitype.TemplateBuildRequest{Name: "d13", Recipe: "debian13"}) {
		t.Fatalf("build via the API: %v %+v\n%s", err, p, out)
	}
	if strings.Count(out, "image: downloading") != 1 || strings.Count(out, "create: VM 100") != 1 || !strings.Contains(out, "done: template") {
		t.Errorf("progress printed:\n%s", out)
	}
	mu.Lock()
	looks, fail = 0, true
	mu.Unlock()
	if _, err := run("d13", "--recipe", "debian13", "--via-api", "--poll", "10ms"); err == nil || !strings.Contains(err.Error(), "boot: no agent") {
		t.Errorf("a failed build: %v", err)
	}

	img := filepath.Join(dir, "box.ova")
	data := bytes.Repeat([]byte("ova "), 5000)
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run("d13", "--upload", img, "--ova-disk", "d.vmdk"); err == nil || !strings.Contains(err.Error(), "--upload goes with --via-api") {
		t.Errorf("--upload without --via-api: %v", err)
	}
	mu.Lock()
	looks, fail = 0, false
	mu.Unlock()
	out, err = run("d13", "--upload", img, "--ova-disk", "d.vmdk", "--via-api", "--poll", "10ms")
	sum := sha256.Sum256(data)
	want := fmt.Sprintf("file=box.ova&ova_disk=d.vmdk&sha256=%x %d %d %x", sum, len(data), len(data), sum)
	mu.Lock()
	got := append([]string(nil), puts...)
	mu.Unlock()
	if err != nil || len(got) != 1 || got[0] != want || !strings.Contains(out, "done: template") {
		t.Errorf("upload via the API: %v %q, want %q\n%s", err, got, want, out)
	}

	// --import-only: with --upload, the mode in the query; else refused
	posted := len(asked())
	if _, err := run("d13", "--from", "local:import/x.ova", "--import-only", "--via-api"); err == nil || !strings.Contains(err.Error(), "goes with --upload") || len(asked()) != posted {
		t.Errorf("--import-only --via-api without --upload: %v (%d posts)", err, len(asked())-posted)
	}
	mu.Lock()
	looks = 0
	mu.Unlock()
	out, err = run("d13", "--upload", img, "--import-only", "--disk-bus", "ide", "--via-api", "--poll", "10ms")
	want = fmt.Sprintf("disk_bus=ide&file=box.ova&import_only=true&sha256=%x %d %d %x", sum, len(data), len(data), sum)
	mu.Lock()
	got = append([]string(nil), puts...)
	mu.Unlock()
	if err != nil || len(got) != 2 || got[1] != want {
		t.Errorf("import-only upload via the API: %v %q, want %q\n%s", err, got, want, out)
	}
}

// TestTemplateBuildDirsFromConfig: `template build` on the node takes the
// daemon's lock and ledger directories ([templates] lock_dir and
// state_dir) unless --lock-dir or --state-dir names others: with a
// ledger of its own it would refuse the daemon's template of a name (and
// the daemon the CLI's), with a lock of its own build at once the name
// the daemon builds.
func TestTemplateBuildDirsFromConfig(t *testing.T) {
	tc := config.TemplatesSection{LockDir: "/run/site/locks", StateDir: "/var/lib/site/ledger"}
	for _, c := range []struct {
		args             []string
		wantLock, wantSt string
	}{
		{nil, "/run/site/locks", "/var/lib/site/ledger"},
		{[]string{"--state-dir", "/srv/ledger"}, "/run/site/locks", "/srv/ledger"},
		{[]string{"--lock-dir", "/run/l"}, "/run/l", "/var/lib/site/ledger"},
	} {
		cmd := newTemplateBuildCmd(&globals{})
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		lock, st := nodeDirs(cmd, tc)
		if lock != c.wantLock || st != c.wantSt {
			t.Errorf("%v: lock %s, ledger %s; want %s and %s", c.args, lock, st, c.wantLock, c.wantSt)
		}
	}
}

// TestBuildRecipeChecksum: --checksum with --recipe alone replaces the
// recipe's checksum list with the digest given (kali2025.4: its archive's,
// still unpacked to its raw disk); the recipe's image is kept.
func TestBuildRecipeChecksum(t *testing.T) {
	sha := "sha256:" + strings.Repeat("ab", 32)
	r, err := buildFlags{recipe: "kali2025.4", checksum: sha}.buildRecipe()
	if err != nil {
		t.Fatal(err)
	}
	shipped := templatebuild.Recipes()["kali2025.4"].Image
	if img := r.Image; img.Checksum != sha || img.ChecksumURL != "" || img.URL != shipped.URL || img.Unpack != "disk.raw" || img.File != shipped.File {
		t.Errorf("image %+v", img)
	}
	if r, err := (buildFlags{recipe: "kali2025.4"}).buildRecipe(); err != nil || r.Image.ChecksumURL != shipped.ChecksumURL || r.Image.Checksum != "" {
		t.Errorf("without --checksum: %+v %v", r.Image, err)
	}
}
