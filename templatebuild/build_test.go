package templatebuild

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
)

var (
	sumA = strings.Repeat("a", 128)
	sumB = strings.Repeat("b", 128)
)

const debURL = "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2"

// builtTemplate is a finished, hardened template's config.
func builtTemplate(name, tags string) map[string]string {
	c, _ := hardening.CloneChanges(map[string]string{})
	c["name"], c["template"], c["tags"], c["status"] = name, "1", tags, "stopped"
	c["scsi0"], c["scsihw"] = "local-lvm:base-120-disk-0,size=16G", "virtio-scsi-single"
	return c
}

// debFile is the file a debian13 build downloads its image to.
var debFile = BuildFile(debURL, "debian-13-genericcloud-amd64.qcow2", sumA)

// world is the node a case starts from.
type world struct {
	pve   *fakePVE
	agent *fakeAgent
	host  *fakeHost
}

func newWorld() world {
	w := world{pve: newFakePVE(), agent: &fakeAgent{replies: map[string]AgentResult{}}, host: newFakeHost()}
	w.host.pve = w.pve
	w.pve.sums[debURL] = sumA
	w.host.lists["https://cloud.debian.org/images/cloud/trixie/latest/SHA512SUMS"] = sumB + "  debian-13-genericcloud-amd64.raw\n" + sumA + "  debian-13-genericcloud-amd64.qcow2\n"
	return w
}

func TestBuild(t *testing.T) {
	debian := Recipes()["debian13"]
	for _, tc := range []struct {
		name   string
		recipe Recipe
		keep   bool
		setup  func(w world)
		// wantErr is a part of the error ("" for success).
		wantErr string
		// wantCalls must appear in order; noCalls must not appear.
		wantCalls, noCalls []string
		// wantVMs are the VM ids left, wantTemplate the finished one (0:
		// none).
		wantVMs      []int
		wantTemplate int
		reused       bool
	}{
		{name: "fresh build, checksum from the list", recipe: debian,
			wantCalls: []string{"download " + debURL + " sha512:" + sumA, "create 100", "resize 100 16G", "start 100", "shutdown 100", "config 100 set=[] del=[ide2 cicustom net0]", "template 100", "config 100 set=[tags] del=[]"},
			wantVMs:   []int{100}, wantTemplate: 100},
		{name: "reuse a finished template", recipe: debian,
			setup: func(w world) {
				w.pve.vms[120] = builtTemplate("t1", "builtin-debian13;inspect;pvei-template")
				w.host.ledger[120] = Record{Name: "t1", State: StateTemplate}
			},
			noCalls: []string{"download", "create", "delete"}, wantVMs: []int{120}, wantTemplate: 120, reused: true},
		{name: "a half-built VM is destroyed first", recipe: debian,
			setup: func(w world) {
				w.pve.vms[100] = map[string]string{"name": "t1", "tags": TagBuilding, "status": "running"}
				w.host.ledger[100] = Record{Name: "t1", State: StateBuilding}
			},
			wantCalls: []string{"delete 100", "download", "create 100", "template 100"}, wantVMs: []int{100}, wantTemplate: 100},
		{name: "a half-built template (killed before its tags) is destroyed", recipe: debian,
			setup: func(w world) {
				w.pve.vms[100] = map[string]string{"name": "t1", "tags": TagBuilding, "template": "1"}
				w.host.ledger[100] = Record{Name: "t1", State: StateTemplate}
			},
			wantCalls: []string{"delete 100", "create 100"}, wantVMs: []int{100}, wantTemplate: 100},
		{name: "another VM of the name is refused, nothing changes", recipe: debian,
			setup: func(w world) {
				w.pve.vms[130] = map[string]string{"name": "t1", "template": "1", "tags": "mine"}
			},
			wantErr: "VM 130 is named \"t1\" and is not this build's", noCalls: []string{"download", "create", "delete"}, wantVMs: []int{130}},
		{name: "a template of another recipe is not reused", recipe: debian,
			setup: func(w world) {
				w.pve.vms[130] = map[string]string{"name": "t1", "template": "1", "tags": "builtin-ubuntu24.04;inspect;pvei-template"}
			},
			wantErr: "is not this build's", noCalls: []string{"create"}, wantVMs: []int{130}},
		{name: "image on the node with its checksum: no download", recipe: debian,
			setup: func(w world) {
				w.pve.vols["local:import/"+debFile] = sumA
			},
			wantCalls: []string{"create 100", "template 100"}, noCalls: []string{"download"}, wantVMs: []int{100}, wantTemplate: 100},
		{name: "a file of the URL's name is not the build's: its own downloaded", recipe: debian,
			setup: func(w world) {
				w.pve.vols["local:import/debian-13-genericcloud-amd64.qcow2"] = sumB
			},
			wantCalls: []string{"download " + debURL, "create 100"}, wantVMs: []int{100}, wantTemplate: 100},
		{name: "the build's file replaced on the storage: refused, nothing made", recipe: debian,
			setup: func(w world) {
				w.pve.vols["local:import/"+debFile] = sumB
			},
			wantErr: "it is not the image", noCalls: []string{"download", "create"}},
		{name: "the image replaced during the import: the VM is destroyed", recipe: debian,
			setup: func(w world) {
				w.pve.onCreate = func(f *fakePVE) { f.vols["local:import/"+debFile] = sumB }
			},
			wantErr: "changed while it was imported", wantCalls: []string{"download", "create 100", "delete 100"}, noCalls: []string{"start"}},
		{name: "checksum mismatch in the download task: no VM", recipe: debian,
			setup:   func(w world) { w.pve.sums[debURL] = sumB },
			wantErr: "checksum mismatch", noCalls: []string{"create"}},
		{name: "checksum list without the file", recipe: debian,
			setup: func(w world) {
				w.host.lists["https://cloud.debian.org/images/cloud/trixie/latest/SHA512SUMS"] = sumB + "  other.qcow2\n"
			},
			wantErr: "no line for debian-13-genericcloud-amd64.qcow2", noCalls: []string{"download", "create"}},
		{name: "volume not on the node", recipe: Generic(Image{Volume: "local:import/x.qcow2", File: "x.qcow2"}),
			wantErr: "volume local:import/x.qcow2 is not on storage local", noCalls: []string{"create"}},
		{name: "OVA volume on the node, no checksum", recipe: Generic(Image{Volume: "local:import/u.ova", File: "u.ova", Disk: "d.vmdk"}),
			setup: func(w world) {
				w.pve.vols["local:import/u.ova"] = ""
				w.pve.content += ",images"
			},
			wantCalls: []string{"create 100", "template 100"}, noCalls: []string{"download", "resize"}, wantVMs: []int{100}, wantTemplate: 100},
		{name: "OVA with no storage to extract it on: nothing made", recipe: Recipes()["ubuntu24.04"],
			wantErr: "an OVA's disk is extracted on a file-based storage with content images", noCalls: []string{"download", "create"}},
		{name: "an id taken meanwhile: the next one, the other VM untouched", recipe: debian,
			setup:     func(w world) { w.pve.raced = map[int]bool{100: true} },
			wantCalls: []string{"create 100", "create 101", "template 101"}, noCalls: []string{"delete"}, wantVMs: []int{100, 101}, wantTemplate: 101},
		{name: "a create that fails in its task: its config is removed", recipe: debian,
			setup:   func(w world) { w.pve.failCreate = "import failed: no space left" },
			wantErr: "no space left", wantCalls: []string{"create 100", "delete 100"}},
		{name: "snippet storage without snippets: nothing created", recipe: debian,
			setup:   func(w world) { w.pve.content = "iso,vztmpl,import" },
			wantErr: "storage local does not take snippets", noCalls: []string{"create"}},
		{name: "cloud-init error: the VM is destroyed", recipe: debian,
			setup: func(w world) {
				w.agent.replies["cloud-init"] = AgentResult{Exit: 1, Output: "status: error"}
			},
			wantErr: "cloud-init failed (exit 1): status: error", wantCalls: []string{"create 100", "start 100", "delete 100"}, noCalls: []string{"template"}},
		{name: "cloud-init never done: bounded, destroyed", recipe: debian,
			setup: func(w world) {
				w.agent.replies["cloud-init"] = AgentResult{Exit: 137, TimedOut: true, Output: "......"}
			},
			wantErr: "cloud-init did not finish within 30m0s", wantCalls: []string{"delete 100"}, noCalls: []string{"template"}},
		{name: "cloud-init error with --keep-failed: the VM stays, tagged building", recipe: debian, keep: true,
			setup: func(w world) {
				w.agent.replies["cloud-init"] = AgentResult{Exit: 1, Output: "status: error"}
			},
			wantErr: "cloud-init failed", noCalls: []string{"delete", "template"}, wantVMs: []int{100}},
		{name: "no cloud-init in the image: the checks decide (pass)", recipe: debian,
			setup:     func(w world) { w.agent.replies["cloud-init"] = AgentResult{Exit: 127} },
			wantCalls: []string{"template 100"}, wantVMs: []int{100}, wantTemplate: 100},
		{name: "a failing check: destroyed", recipe: debian,
			setup: func(w world) {
				w.agent.replies["dpkg-query"] = AgentResult{Exit: 1, Output: "dpkg-query: no packages found matching gcc"}
			},
			wantErr: "no packages found matching gcc", wantCalls: []string{"delete 100"}, noCalls: []string{"template"}},
		{name: "the agent never answers: bounded, destroyed", recipe: debian,
			setup:   func(w world) { w.agent.down = true },
			wantErr: "did not answer within", wantCalls: []string{"start 100", "delete 100"}, noCalls: []string{"template"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			if tc.setup != nil {
				tc.setup(w)
			}
			var out bytes.Buffer
			b, err := New(w.pve, w.agent, w.host, Options{Name: "t1", Recipe: tc.recipe, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
				Bridge: "vmbr0", KeepFailed: tc.keep, AgentWait: 50 * time.Millisecond, AgentPoll: time.Millisecond, Progress: &out})
			if err != nil {
				t.Fatal(err)
			}
			res, err := b.Run(context.Background())
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("build: %v\n%s", err, out.String())
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("build: %v, want %q\n%s", err, tc.wantErr, out.String())
			}
			calls := strings.Join(w.pve.calls, "\n")
			at := 0
			for _, c := range tc.wantCalls {
				i := strings.Index(calls[at:], c)
				if i < 0 {
					t.Fatalf("no call %q (in order) in:\n%s", c, calls)
				}
				at += i + len(c)
			}
			for _, c := range tc.noCalls {
				for _, got := range w.pve.calls {
					if strings.HasPrefix(got, c) {
						t.Errorf("unexpected call %q in:\n%s", got, calls)
					}
				}
			}
			var ids []int
			for id := range w.pve.vms {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, tc.wantVMs) {
				t.Errorf("VMs left %v, want %v", ids, tc.wantVMs)
			}
			if res.Reused != tc.reused {
				t.Errorf("reused %v, want %v", res.Reused, tc.reused)
			}
			for id, c := range w.pve.vms {
				if id != tc.wantTemplate {
					continue
				}
				if c["template"] != "1" || res.VMID != id {
					t.Errorf("VM %d: template %q, result VMID %d", id, c["template"], res.VMID)
				}
				if tc.reused {
					continue
				}
				if c["tags"] != "builtin-"+tc.recipe.Name+";inspect;pvei-template" && !(tc.recipe.Name == "" && c["tags"] == "inspect;pvei-template") {
					t.Errorf("tags %q", c["tags"])
				}
				if f := hardening.Check(c).TemplateFailures(); len(f) > 0 || !hardening.Check(c).OK() {
					t.Errorf("template not hardened: %v", hardening.Check(c).Failed())
				}
				for _, k := range sealDelete {
					if _, ok := c[k]; ok {
						t.Errorf("template keeps %s=%s", k, c[k])
					}
				}
			}
			if tc.keep {
				if c := w.pve.vms[100]; c == nil || c["tags"] != TagBuilding {
					t.Errorf("kept VM: %v", c)
				}
			}
			if len(w.host.files) != 0 {
				t.Errorf("snippets left: %v", w.host.files)
			}
		})
	}
}

// TestBuildSnippets: the build writes the user-data (agent first, the
// recipe's packages) and the name-matched network-config, and points
// cicustom at them on the snippet storage.
func TestBuildSnippets(t *testing.T) {
	w := newWorld()
	w.pve.vols["local:import/x.qcow2"] = ""
	r := Generic(Image{Volume: "local:import/x.qcow2", File: "x.qcow2"})
	r.Packages = []string{"curl"}
	b, err := New(w.pve, w.agent, w.host, Options{Name: "t2", Recipe: r, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "vmbr9"})
	if err != nil {
		t.Fatal(err)
	}
	cicustom, files, err := b.seed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cicustom != "user=local:snippets/pvei-build-t2-user.yaml,network=local:snippets/pvei-build-t2-network.yaml" {
		t.Errorf("cicustom %q", cicustom)
	}
	ud := w.host.files["/var/lib/vz/snippets/pvei-build-t2-user.yaml"]
	if !strings.HasPrefix(ud, "#cloud-config\n") || !strings.Contains(ud, "  - qemu-guest-agent\n  - curl\n") || !strings.Contains(ud, "[systemctl, start, qemu-guest-agent]") {
		t.Errorf("user-data:\n%s", ud)
	}
	if nc := w.host.files[files[1]]; !strings.Contains(nc, `name: "e*"`) || strings.Contains(nc, "macaddress") {
		t.Errorf("network-config:\n%s", nc)
	}
	conf := b.createConfig("local:import/x.qcow2", cicustom, "vmbr9")
	if conf["scsi0"] != "local-lvm:0,import-from=local:import/x.qcow2" || conf["ide2"] != "local-lvm:cloudinit" || conf["net0"] != "virtio,bridge=vmbr9" || conf["tags"] != TagBuilding {
		t.Errorf("create config %v", conf)
	}
}

func TestOptionsAndImages(t *testing.T) {
	ok := Options{Name: "debian13", Recipe: Recipes()["debian13"], Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "vmbr0"}
	for _, tc := range []struct {
		name    string
		mut     func(o *Options)
		wantErr string
	}{
		{"ok", func(*Options) {}, ""},
		{"bad name", func(o *Options) { o.Name = "a_b" }, "want a DNS name"},
		{"bad storage", func(o *Options) { o.Storage = "local lvm" }, "--storage"},
		{"kali from its archive", func(o *Options) { o.Recipe = Recipes()["kali2025.4"] }, ""},
		{"an archive's member to no disk", func(o *Options) {
			o.Recipe = Recipes()["kali2025.4"]
			o.Recipe.Image.File = "k.iso"
		}, "both must be disk files"},
		{"an archive's member in a directory", func(o *Options) {
			o.Recipe = Recipes()["kali2025.4"]
			o.Recipe.Image.Unpack = "../disk.raw"
		}, "both must be disk files"},
		{"kali from a volume", func(o *Options) {
			o.Recipe = Recipes()["kali2025.4"]
			o.Recipe.Image = Image{Volume: "local:import/k.raw", File: "k.raw"}
		}, ""},
		{"bad package", func(o *Options) { o.Recipe.Packages = []string{"x; rm -rf /"} }, "not a Debian package name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			o.Recipe.Packages = slices.Clone(o.Recipe.Packages)
			tc.mut(&o)
			err := o.Validate()
			if (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v, want %q", err, tc.wantErr)
			}
		})
	}
	for _, tc := range []struct {
		from, checksum, disk string
		wantErr              string
	}{
		{"https://h/x.qcow2", "", "", ""},
		{"https://h/x.qcow2", "sha256:" + strings.Repeat("0", 64), "", ""},
		{"https://h/x.qcow2", "sha256:00", "", "wants 64 hex digits"},
		{"https://h/x.qcow2", "md5:00", "", "want sha256:HEX"},
		{"https://h/x.tar.xz", "", "", "not one Proxmox imports"},
		{"https://h/x.ova", "", "", "--ova-disk"},
		{"https://h/x.ova", "", "d.vmdk", ""},
		{"https://h/x.qcow2", "", "d.vmdk", "only an .ova"},
		{"file:///x.qcow2", "", "", "want an http(s)"},
	} {
		if _, err := ImageFromURL(tc.from, tc.checksum, tc.disk); (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ImageFromURL(%q, %q, %q): %v, want %q", tc.from, tc.checksum, tc.disk, err, tc.wantErr)
		}
	}
	for _, tc := range []struct {
		volid, wantErr, wantVol, wantDisk string
	}{
		{"local:import/x.qcow2", "", "local:import/x.qcow2", ""},
		{"local:import/u.ova/d.vmdk", "", "local:import/u.ova", "d.vmdk"},
		{"local:import/u.ova", "names the disk", "", ""},
		{"local:iso/x.iso", "want an http(s) URL or a volume", "", ""},
		{"local:import/../x.qcow2", "not an importable file", "", ""},
	} {
		img, err := ImageFromVolume(tc.volid)
		if (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ImageFromVolume(%q): %v, want %q", tc.volid, err, tc.wantErr)
		}
		if err == nil && (img.Volume != tc.wantVol || img.Disk != tc.wantDisk) {
			t.Errorf("ImageFromVolume(%q) = %+v", tc.volid, img)
		}
	}
}

func TestDiskGiB(t *testing.T) {
	for in, want := range map[string]float64{"local-lvm:vm-1-disk-0,size=3G": 3, "x,size=2252M": 2252.0 / 1024, "x,size=1T": 1024} {
		if got, ok := diskGiB(in); !ok || got != want {
			t.Errorf("diskGiB(%q) = %v %v, want %v", in, got, ok, want)
		}
	}
	if _, ok := diskGiB("x"); ok {
		t.Error("a drive without size= has a size")
	}
}

// TestLock: a second build of a name is refused at once while the first
// holds the lock; another name is not, and the lock is free after unlock.
func TestLock(t *testing.T) {
	dir := t.TempDir()
	unlock, err := Lock(dir, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Lock(dir, "t1"); !errors.Is(err, ErrBusy) {
		t.Errorf("second lock: %v, want ErrBusy", err)
	}
	u2, err := Lock(dir, "t2")
	if err != nil {
		t.Fatalf("another name: %v", err)
	}
	u2()
	unlock()
	u3, err := Lock(dir, "t1")
	if err != nil {
		t.Fatalf("after unlock: %v", err)
	}
	u3()
	if _, err := Lock(dir, "../x"); err == nil {
		t.Error("a name with a path accepted")
	}
}

func TestFindChecksum(t *testing.T) {
	list := []byte(sumA + "  a.qcow2\n" + strings.ToUpper(sumB) + " *b.qcow2\n" + "zz  c.qcow2\n")
	for _, tc := range []struct{ file, want, wantErr string }{
		{"a.qcow2", sumA, ""},
		{"b.qcow2", sumB, ""},
		{"c.qcow2", "", "no digest of 128 hex digits"},
		{"d.qcow2", "", "no line for d.qcow2"},
	} {
		got, err := findChecksum(list, tc.file, 128)
		if got != tc.want || (tc.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %q %v, want %q %q", tc.file, got, err, tc.want, tc.wantErr)
		}
	}
}
