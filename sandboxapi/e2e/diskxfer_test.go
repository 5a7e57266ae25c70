package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/pve-inspect/pve-inspect/diskxfer"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// flakyDetach fails the next n unplugs.
type flakyDetach struct {
	pveemu.BedBackend
	n atomic.Int32
}

func (f *flakyDetach) DetachDisk(ctx context.Context, vmid int, slot string) error {
	if f.n.Add(-1) >= 0 {
		return errors.New("injected: device_del did not complete")
	}
	return f.BedBackend.DetachDisk(ctx, vmid, slot)
}

// swapTransfer lets a test change the Transfer behind a running server.
type swapTransfer struct {
	mu sync.Mutex
	t  *diskxfer.Transfer
}

func (s *swapTransfer) get() *diskxfer.Transfer  { s.mu.Lock(); defer s.mu.Unlock(); return s.t }
func (s *swapTransfer) set(t *diskxfer.Transfer) { s.mu.Lock(); s.t = t; s.mu.Unlock() }

func (s *swapTransfer) Upload(ctx context.Context, vmid int, g sandbox.Guest, path string, r io.Reader, size int64, mode os.FileMode) error {
	return s.get().Upload(ctx, vmid, g, path, r, size, mode)
}

func (s *swapTransfer) Download(ctx context.Context, vmid int, g sandbox.Guest, path string, size int64, w io.Writer) (int64, error) {
	return s.get().Download(ctx, vmid, g, path, size, w)
}

// stream is a deterministic pseudo-random byte stream of n bytes.
func stream(seed byte, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{seed}), n)
}

func sumHex(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

func TestBedDiskTransfer(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	flaky := &flakyDetach{}
	sw := &swapTransfer{}
	var px *pveapi.Client
	e := newBedEnvWith(t, ctx, func(b pveemu.BedBackend) pveemu.Backend { flaky.BedBackend = b; return flaky }, func(o *options) {
		px = o.Proxmox.(*pveapi.Client)
		o.MaxFileBytes = 2 << 30
		o.DiskTransfer = sw
	})
	sw.set(diskxfer.New(px, diskxfer.Options{}))
	// The daemon's token allocates and frees on the dir storage with the
	// grants pve-access-setup creates (the pool's storage and the
	// transfer role), nothing more.
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	vmid := sb.VMs[0].VMID
	images := filepath.Join(e.bed.Dir(), "pveemu", "storage", "local", "images")
	imagesLeft := func() []string {
		var left []string
		_ = filepath.Walk(images, func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				left = append(left, p)
			}
			return nil
		})
		return left
	}
	// A download's response carries its size as Content-Length, so the
	// client has every byte (and returns) while the daemon may still be
	// detaching and freeing the transfer volume behind it; an upload
	// answers only after its cleanup. noImage waits for that cleanup,
	// bounded, instead of racing it.
	noImage := func(t *testing.T) {
		t.Helper()
		var left []string
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if left = imagesLeft(); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("image left on the node: %v", left)
		}
	}
	diskRequests := func() int {
		n := 0
		for _, r := range e.emu.Requests() {
			if strings.HasSuffix(r.Route, "/storage/{storage}/content") {
				n++
			}
		}
		return n
	}
	guestSum := func(t *testing.T, path string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sha256sum", "--", path}, TimeoutSeconds: 600})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("sha256sum in the guest: %v %+v", err, res)
		}
		return strings.Fields(string(res.Stdout))[0]
	}
	problem := func(t *testing.T, err error, want string) {
		t.Helper()
		var p *apitype.Problem
		if !asProblem(err, &p) || p.Type != want {
			t.Fatalf("got %v, want problem %s", err, want)
		}
	}

	t.Run("1 GiB up and down through the disk path", func(t *testing.T) {
		const size = 1 << 30
		before := diskRequests()
		up := sha256.New()
		if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/big", io.TeeReader(stream(1, size), up), size, 0o640); err != nil {
			t.Fatal(err)
		}
		if diskRequests() == before {
			t.Fatal("the upload did not allocate a transfer volume")
		}
		if got := guestSum(t, "/root/big"); got != sumHex(up) {
			t.Fatalf("guest file sha256 %s, sent %s", got, sumHex(up))
		}
		noImage(t)
		before = diskRequests()
		down := sha256.New()
		n, err := e.c.ReadFile(ctx, sb.ID, "vm0", "/root/big", down)
		if err != nil || n != size {
			t.Fatalf("download: %d bytes, %v", n, err)
		}
		if diskRequests() == before {
			t.Fatal("the download did not allocate a transfer volume")
		}
		if sumHex(down) != sumHex(up) {
			t.Fatalf("downloaded sha256 %s, uploaded %s", sumHex(down), sumHex(up))
		}
		noImage(t)
		// Hot-plugs go through the async POST .../config (a task), never
		// the synchronous PUT behind pveproxy's 30 s timeout (issue 25).
		plugs := 0
		for _, r := range e.emu.Requests() {
			if !strings.HasSuffix(r.Route, "/qemu/{vmid}/config") {
				continue
			}
			slot := false
			for k := range r.Params {
				slot = slot || regexp.MustCompile(`^scsi\d+$`).MatchString(k)
			}
			_, del := r.Params["delete"]
			if slot || del && r.Params["force"] != nil {
				plugs++
				if r.Method != "POST" {
					t.Errorf("hot-plug through %s %s %v", r.Method, r.Path, r.Params)
				}
			}
		}
		if plugs < 4 {
			t.Errorf("%d hot-plug requests seen, want at least 4 (attach and detach, both ways)", plugs)
		}
		if _, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"rm", "-f", "/root/big"}}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("below the threshold the agent path is used", func(t *testing.T) {
		before := diskRequests()
		data := bytes.Repeat([]byte("small "), 100000)
		if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/small", bytes.NewReader(data), int64(len(data)), 0); err != nil {
			t.Fatal(err)
		}
		var back bytes.Buffer
		if _, err := e.c.ReadFile(ctx, sb.ID, "vm0", "/root/small", &back); err != nil || !bytes.Equal(back.Bytes(), data) {
			t.Fatalf("read back %d bytes: %v", back.Len(), err)
		}
		if diskRequests() != before {
			t.Fatal("a small file allocated a transfer volume")
		}
	})

	t.Run("a guest that never reads the disk", func(t *testing.T) {
		// A head that hangs in the guest's own PATH stands in for a guest
		// that does not copy; the transfer's timeout ends it.
		fake := "#!/bin/sh\nexec sleep 600\n"
		if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/usr/local/bin/head", strings.NewReader(fake), int64(len(fake)), 0o755); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"rm", "-f", "/usr/local/bin/head"}})
		}()
		sw.set(diskxfer.New(px, diskxfer.Options{Timeout: 3 * time.Second}))
		defer sw.set(diskxfer.New(px, diskxfer.Options{}))
		err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/never", stream(2, 40<<20), 40<<20, 0)
		problem(t, err, apitype.ProblemGuestTimeout)
		noImage(t)
		res, _ := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sh", "-c", "ls -a /root | grep -c -e never -e pve-inspect-xfer"}})
		if res == nil || strings.TrimSpace(string(res.Stdout)) != "0" {
			t.Errorf("guest has a (partial) file: %+v", res)
		}
	})

	t.Run("a full guest file system", func(t *testing.T) {
		g, ok := e.bed.Guest(vmid)
		if !ok {
			t.Fatal("guest not running")
		}
		pid, err := g.InitPID()
		if err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-m", "-r", "--wd=/", "/bin/sh", "-c",
			"mkdir -p /mnt/small && mount -t tmpfs -o size=16m tmpfs /mnt/small").CombinedOutput(); err != nil {
			t.Fatalf("mount a small tmpfs in the guest: %v %s", err, out)
		}
		err = e.c.WriteFile(ctx, sb.ID, "vm0", "/mnt/small/f", stream(3, 40<<20), 40<<20, 0)
		problem(t, err, apitype.ProblemGuestNoSpace)
		noImage(t)
		res, _ := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sh", "-c", "ls -A /mnt/small | wc -l"}})
		if res == nil || strings.TrimSpace(string(res.Stdout)) != "0" {
			t.Errorf("partial file left in the guest: %+v", res)
		}
	})

	t.Run("sizes at block edges, straight through the transfer", func(t *testing.T) {
		// 0 bytes and a block and a bit: the progress record's place and
		// the padded last block, which the API's threshold keeps away.
		g := qga.New(qga.Options{}).SandboxGuests()(filepath.Join(e.bed.QGADir(), strconv.Itoa(vmid)+".qga"))
		for _, size := range []int64{0, 4<<20 + 3} {
			up := sha256.New()
			if err := sw.get().Upload(ctx, vmid, g, "/root/edge", io.TeeReader(stream(6, size), up), size, 0o600); err != nil {
				t.Fatalf("upload %d bytes: %v", size, err)
			}
			if got := guestSum(t, "/root/edge"); got != sumHex(up) {
				t.Fatalf("%d bytes: guest file sha256 %s, sent %s", size, got, sumHex(up))
			}
			down := sha256.New()
			if n, err := sw.get().Download(ctx, vmid, g, "/root/edge", size, down); err != nil || n != size || sumHex(down) != sumHex(up) {
				t.Fatalf("download %d bytes: %d, %v", size, n, err)
			}
			noImage(t)
		}
	})

	t.Run("a client that stops sending mid-upload", func(t *testing.T) {
		// The guest copies while the node writes; a body that breaks off
		// ends both, and neither an image nor a guest temp file remains.
		before := diskRequests()
		body := io.MultiReader(stream(5, 20<<20), iotest.ErrReader(errors.New("client went away")))
		if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/cut", body, 60<<20, 0); err == nil {
			t.Fatal("a broken body was accepted")
		}
		// The client's error can come before the server has cleaned up.
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sh", "-c", "ls -a /root | grep -c -e cut -e pve-inspect-xfer"}})
			files := 0
			if err == nil {
				files, _ = strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
			}
			var left []string
			_ = filepath.Walk(images, func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() {
					left = append(left, p)
				}
				return nil
			})
			if err == nil && files == 0 && len(left) == 0 && diskRequests() > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after a broken upload: guest files %d (%v), images %v", files, err, left)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	// imageRefs are the keys of the VM's config, current, with pending
	// values, and in GET .../pending, that name a transfer image.
	imageRefs := func(t *testing.T) []string {
		t.Helper()
		cur, pend, err := px.DiskConfig(ctx, vmid)
		if err != nil {
			t.Fatal(err)
		}
		var items []map[string]any
		if err := px.Get(ctx, fmt.Sprintf("/nodes/pve/qemu/%d/pending", vmid), &items); err != nil {
			t.Fatal(err)
		}
		var refs []string
		for k, v := range cur {
			if strings.Contains(v, "-pvei-") {
				refs = append(refs, k)
			}
		}
		for k, v := range pend {
			if strings.Contains(v, "-pvei-") && cur[k] != v {
				refs = append(refs, k+" (pending)")
			}
		}
		for _, it := range items {
			if it["delete"] != nil || it["pending"] != nil && strings.Contains(fmt.Sprint(it["pending"]), "-pvei-") {
				refs = append(refs, fmt.Sprintf("GET pending: %v", it))
			}
		}
		return refs
	}

	t.Run("a hot-plug that fails", func(t *testing.T) {
		// qemu-server keeps a disk whose hot-plug QEMU refused pending;
		// the transfer says so, reverts it and frees the image, and
		// nothing in the VM's config names the freed image.
		e.emu.FailNextHotplug(vmid, "error on hotplug device 'virtioscsi2'")
		err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/h", stream(7, 33<<20), 33<<20, 0)
		if err == nil || !strings.Contains(err.Error(), "hot-plug of the transfer disk") || !strings.Contains(err.Error(), "hotplug problem - error on hotplug device 'virtioscsi2'") {
			t.Fatalf("got %v, want the refused hot-plug named", err)
		}
		noImage(t)
		if refs := imageRefs(t); len(refs) != 0 {
			t.Fatalf("the VM's config names a freed transfer image: %v", refs)
		}
		// and the next transfer takes the same slot and works
		if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/h", stream(7, 33<<20), 33<<20, 0); err != nil {
			t.Fatal(err)
		}
		noImage(t)
	})

	t.Run("a detach that fails", func(t *testing.T) {
		for _, fails := range []int32{1, 99} {
			t.Run(fmt.Sprintf("%d failures", fails), func(t *testing.T) {
				flaky.n.Store(fails)
				defer flaky.n.Store(0)
				err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/d", stream(4, 33<<20), 33<<20, 0)
				if fails == 1 {
					if err != nil {
						t.Fatalf("one failed unplug is retried: %v", err)
					}
					noImage(t)
					return
				}
				// An unplug that keeps failing leaves the image plugged
				// (freeing it would leave the config naming a freed
				// volume) and no deletion pending; it goes with the VM,
				// or the sweep frees it.
				if err == nil || !strings.Contains(err.Error(), "detach") || !strings.Contains(err.Error(), "stays plugged") {
					t.Fatalf("got %v, want the failed detach reported", err)
				}
				refs := imageRefs(t)
				if len(refs) != 1 || !strings.HasPrefix(refs[0], "scsi") || len(imagesLeft()) != 1 {
					t.Fatalf("config references %v, images %v; want the image kept, plugged, nothing pending", refs, imagesLeft())
				}
				flaky.n.Store(0)
				e.emu.SetStorageContent("local", "backup,images,iso,vztmpl")
				rep, err := sw.get().Sweep(ctx)
				if err != nil || len(rep.Freed) != 1 {
					t.Fatalf("sweep: %+v %v", rep, err)
				}
				noImage(t)
				if refs := imageRefs(t); len(refs) != 0 {
					t.Fatalf("after the sweep the config names %v", refs)
				}
			})
		}
	})
}
