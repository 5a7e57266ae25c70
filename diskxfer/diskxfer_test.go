package diskxfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// fakePx keeps images as files in a directory, models one VM's config
// as qemu-server keeps it (a failed hot-plug stays pending, a failed
// unplug a pending deletion, a reverted pending disk becomes unusedN) and
// records calls.
type fakePx struct {
	dir        string
	calls      []string
	failAttach error
	failDetach int // how many detaches fail
	failFree   error
	conf       map[string]string // the VM's current config (vmConf() when nil)
	pend       map[string]string // values only pending
	pendDel    map[string]bool   // keys whose deletion is pending
	qemu       string            // running QEMU ("10.1.2" when empty)
	asked      int               // RunningQEMU calls
}

// vmConf is a running VM's config as the tests' templates give it: disks
// in scsi0 and scsi1, a q35 machine, a virtio SCSI controller; extra are
// "key=value" overrides ("key=" deletes).
func vmConf(extra ...string) map[string]string {
	c := map[string]string{"scsi0": "local-lvm:vm-1-disk-0", "scsi1": "local-lvm:vm-1-disk-1", "machine": "q35", "scsihw": "virtio-scsi-single"}
	for _, e := range extra {
		k, v, _ := strings.Cut(e, "=")
		if v == "" {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func (f *fakePx) init() {
	if f.conf == nil {
		f.conf = vmConf()
	}
	if f.pend == nil {
		f.pend = map[string]string{}
	}
	if f.pendDel == nil {
		f.pendDel = map[string]bool{}
	}
}

func (f *fakePx) AllocVolume(ctx context.Context, storage string, vmid int, name string, size int64) (string, error) {
	f.calls = append(f.calls, "alloc")
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
		return "", err
	}
	return storage + ":" + name, nil
}

func (f *fakePx) VolumePath(ctx context.Context, volid string) (string, error) {
	_, name, _ := strings.Cut(volid, ":")
	return filepath.Join(f.dir, name), nil
}

func (f *fakePx) FreeVolume(ctx context.Context, volid string) error {
	f.calls = append(f.calls, "free")
	if f.failFree != nil {
		return f.failFree
	}
	p, _ := f.VolumePath(ctx, volid)
	return os.Remove(p)
}

func (f *fakePx) DiskConfig(ctx context.Context, vmid int) (map[string]string, map[string]string, error) {
	f.init()
	cur, pend := map[string]string{}, map[string]string{}
	for k, v := range f.conf {
		cur[k] = v
		if !f.pendDel[k] {
			pend[k] = v
		}
	}
	for k, v := range f.pend {
		pend[k] = v
	}
	return cur, pend, nil
}

func (f *fakePx) RunningQEMU(ctx context.Context, vmid int) (string, error) {
	f.asked++
	if f.qemu == "" {
		return "10.1.2", nil
	}
	return f.qemu, nil
}

func (f *fakePx) AttachVolume(ctx context.Context, vmid int, slot, volid, serial string) error {
	f.init()
	f.calls = append(f.calls, "attach "+slot)
	if f.failAttach != nil {
		f.pend[slot] = volid + ",serial=" + serial
		return f.failAttach
	}
	f.conf[slot] = volid + ",serial=" + serial
	return nil
}

func (f *fakePx) DetachVolume(ctx context.Context, vmid int, slot string) error {
	f.init()
	f.calls = append(f.calls, "detach")
	if f.failDetach > 0 && !strings.HasPrefix(slot, "unused") {
		f.failDetach--
		f.pendDel[slot] = true
		return errors.New("unplug timed out")
	}
	volid, _, _ := strings.Cut(f.conf[slot], ",")
	p, _ := f.VolumePath(ctx, volid)
	delete(f.conf, slot)
	delete(f.pendDel, slot)
	return os.Remove(p)
}

func (f *fakePx) RevertPending(ctx context.Context, vmid int, keys ...string) error {
	f.init()
	f.calls = append(f.calls, "revert "+strings.Join(keys, ","))
	for _, k := range keys {
		if _, ok := f.conf[k]; ok {
			delete(f.pend, k)
			delete(f.pendDel, k)
		} else if pv, ok := f.pend[k]; ok {
			delete(f.pend, k)
			volid, _, _ := strings.Cut(pv, ",")
			for i := 0; ; i++ {
				if u := fmt.Sprintf("unused%d", i); f.conf[u] == "" {
					f.conf[u] = volid
					break
				}
			}
		}
	}
	return nil
}

// imageRefs are the config keys, current or pending, that name a
// transfer image.
func (f *fakePx) imageRefs() []string {
	var out []string
	for k, v := range f.conf {
		if strings.Contains(v, "-pvei-") {
			out = append(out, k)
		}
	}
	for k, v := range f.pend {
		if strings.Contains(v, "-pvei-") {
			out = append(out, k+" (pending)")
		}
	}
	for k := range f.pendDel {
		out = append(out, k+" (deletion pending)")
	}
	return out
}

// fakeGuest answers the copy with a fixed result.
type fakeGuest struct {
	sandbox.Guest
	res      *apitype.ExecResult
	err      error
	argv     []string
	cleanups []string // later commands: the temp file removal
}

func (g *fakeGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	if g.argv == nil {
		g.argv = r.Argv
		return g.res, g.err
	}
	g.cleanups = append(g.cleanups, strings.Join(r.Argv, " "))
	return &apitype.ExecResult{}, nil
}

func sumOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestUploadOutcomes(t *testing.T) {
	data := []byte("some bytes for the guest")
	good := sumOf(data)
	tests := []struct {
		name      string
		px        fakePx
		res       *apitype.ExecResult
		execErr   error
		body      []byte
		wantErr   error
		wantCalls string
		plugged   bool // the image is left plugged (its unplug keeps failing)
	}{
		{"copied", fakePx{}, &apitype.ExecResult{Stdout: []byte(good + "\n")}, nil, data, nil, "alloc,attach scsi2,detach", false},
		{"disk never seen", fakePx{}, &apitype.ExecResult{ExitCode: exitNoDevice, Stderr: []byte("did not appear")}, nil, data, sandbox.ErrGuestTimeout, "alloc,attach scsi2,detach", false},
		{"guest copy times out", fakePx{}, &apitype.ExecResult{ExitCode: 137, TimedOut: true}, nil, data, sandbox.ErrGuestTimeout, "alloc,attach scsi2,detach", false},
		{"guest file system full", fakePx{}, &apitype.ExecResult{ExitCode: exitWrite, Stderr: []byte("full")}, nil, data, sandbox.ErrGuestNoSpace, "alloc,attach scsi2,detach", false},
		{"agent gone", fakePx{}, nil, sandbox.ErrGuestUnavailable, data, sandbox.ErrGuestUnavailable, "alloc,attach scsi2,detach", false},
		{"guest prints garbage", fakePx{}, &apitype.ExecResult{Stdout: []byte("ok\n")}, nil, data, sandbox.ErrGuestProtocol, "alloc,attach scsi2,detach", false},
		// the failed hot-plug left scsi2 pending: reverted (the image
		// becomes unused0), then unused0 deleted, which frees it
		{"attach refused", fakePx{failAttach: errors.New("hotplug problem")}, nil, nil, data, nil, "alloc,attach scsi2,revert scsi2,detach", false},
		{"detach fails once", fakePx{failDetach: 1}, &apitype.ExecResult{Stdout: []byte(good)}, nil, data, nil, "alloc,attach scsi2,detach,revert scsi2,detach", false},
		{"detach keeps failing", fakePx{failDetach: 99}, &apitype.ExecResult{Stdout: []byte(good)}, nil, data, nil, "alloc,attach scsi2,detach,revert scsi2,detach,detach,revert scsi2", true},
		{"short body", fakePx{}, nil, nil, data[:3], nil, "alloc,attach scsi2,detach", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.px.dir = t.TempDir()
			g := &fakeGuest{res: tt.res, err: tt.execErr}
			tr := New(&tt.px, Options{})
			err := tr.Upload(context.Background(), 100, g, "/root/f", bytes.NewReader(tt.body), int64(len(data)), 0o640)
			wantOK := tt.name == "copied" || tt.name == "detach fails once"
			switch {
			case wantOK && err != nil:
				t.Fatalf("got %v", err)
			case !wantOK && err == nil:
				t.Fatal("no error")
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("got %v, want %v", err, tt.wantErr)
			}
			if got := strings.Join(tt.px.calls, ","); got != tt.wantCalls {
				t.Errorf("calls %s, want %s", got, tt.wantCalls)
			}
			ents, _ := os.ReadDir(tt.px.dir)
			refs := tt.px.imageRefs()
			switch {
			case tt.plugged:
				// never freed while the config names it: plugged in
				// scsi2, no deletion pending
				if len(ents) != 1 || !slices.Equal(refs, []string{"scsi2"}) {
					t.Errorf("images %v, config references %v; want the image kept, plugged in scsi2 only", ents, refs)
				}
				if !strings.Contains(fmt.Sprint(err), "stays plugged") {
					t.Errorf("got %v, want the plugged image named", err)
				}
			case len(ents) != 0 || len(refs) != 0:
				t.Errorf("images left %v, config references %v", ents, refs)
			}
			if tt.wantErr != nil && (len(g.cleanups) != 1 || !strings.Contains(g.cleanups[0], "/root/.pve-inspect-xfer-pvei")) {
				t.Errorf("failed copy did not remove the guest temp file: %q", g.cleanups)
			}
		})
	}
}

// TestAttachRefusedIsClear: a hot-plug Proxmox refuses is an error that
// says so, and the image it named is freed only after the pending disk
// was reverted: no step of the cleanup frees a volume a key still names.
func TestAttachRefusedIsClear(t *testing.T) {
	px := &fakePx{dir: t.TempDir(), failAttach: errors.New("400 Parameter verification failed. scsi2: hotplug problem - error on hotplug device 'virtioscsi2'")}
	err := New(px, Options{}).Upload(context.Background(), 100, &fakeGuest{}, "/f", strings.NewReader("x"), 1, 0o644)
	if err == nil || !strings.Contains(err.Error(), "hot-plug of the transfer disk into VM 100 as scsi2 failed") || !strings.Contains(err.Error(), "hotplug problem") {
		t.Fatalf("got %v, want the failed hot-plug named", err)
	}
	if refs := px.imageRefs(); len(refs) != 0 {
		t.Fatalf("config still names the image: %v", refs)
	}
}

func TestUploadImageLeftIsReported(t *testing.T) {
	// the reverted disk's unusedN cannot be deleted: the image stays,
	// named by unused0, and the error says so
	px := &fakePx{dir: t.TempDir(), failAttach: errors.New("hotplug problem")}
	err := New(&failingUnused{fakePx: px}, Options{}).Upload(context.Background(), 100, &fakeGuest{}, "/f", strings.NewReader("x"), 1, 0o644)
	if err == nil || !strings.Contains(err.Error(), "unused0 of VM 100") || !strings.Contains(err.Error(), "no Datastore.AllocateSpace") {
		t.Fatalf("got %v, want the failed free reported", err)
	}
}

// failingUnused is fakePx whose deletions of unusedN fail.
type failingUnused struct{ *fakePx }

func (f *failingUnused) DetachVolume(ctx context.Context, vmid int, slot string) error {
	if strings.HasPrefix(slot, "unused") {
		return errors.New("no Datastore.AllocateSpace")
	}
	return f.fakePx.DetachVolume(ctx, vmid, slot)
}

func TestDownload(t *testing.T) {
	data := []byte("bytes from the guest")
	tests := []struct {
		name    string
		guest   string // what the guest "writes" to the disk
		sum     string
		wantErr bool
	}{
		{"matching", string(data), sumOf(data), false},
		{"disk differs from the guest's sum", "other bytes of size!", sumOf(data), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			px := &fakePx{dir: t.TempDir()}
			g := &writingGuest{px: px, content: tt.guest, sum: tt.sum}
			var out bytes.Buffer
			n, err := New(px, Options{}).Download(context.Background(), 100, g, "/f", int64(len(data)), &out)
			if tt.wantErr {
				var ce *ChecksumError
				if !errors.As(err, &ce) || out.Len() != 0 {
					t.Fatalf("got %v and %d bytes, want a checksum error and nothing sent", err, out.Len())
				}
			} else if err != nil || n != int64(len(data)) || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("got %d %q %v", n, out.Bytes(), err)
			}
			if ents, _ := os.ReadDir(px.dir); len(ents) != 0 {
				t.Errorf("image left behind: %v", ents)
			}
		})
	}
}

// writingGuest plays the guest of a download: it writes content into the
// (only) image and prints sum.
type writingGuest struct {
	sandbox.Guest
	px      *fakePx
	content string
	sum     string
}

func (g *writingGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	ents, _ := os.ReadDir(g.px.dir)
	if len(ents) != 1 {
		return nil, fmt.Errorf("%d images", len(ents))
	}
	if err := os.WriteFile(filepath.Join(g.px.dir, ents[0].Name()), []byte(g.content), 0o600); err != nil {
		return nil, err
	}
	return &apitype.ExecResult{Stdout: []byte(g.sum + "\n")}, nil
}

func TestBadArguments(t *testing.T) {
	px := &fakePx{dir: t.TempDir()}
	tr := New(px, Options{})
	if err := tr.Upload(context.Background(), 100, &fakeGuest{}, "relative", strings.NewReader(""), 0, 0o644); !errors.Is(err, sandbox.ErrGuestInvalid) {
		t.Errorf("relative path: %v", err)
	}
	if _, err := tr.Download(context.Background(), 100, &fakeGuest{}, "/f", -1, io.Discard); !errors.Is(err, sandbox.ErrGuestInvalid) {
		t.Errorf("negative size: %v", err)
	}
	if len(px.calls) != 0 {
		t.Errorf("bad input reached Proxmox: %v", px.calls)
	}
}

func FuzzParseSum(f *testing.F) {
	for _, s := range []string{strings.Repeat("a", 64), strings.Repeat("a", 64) + "\n", "", "x", strings.Repeat("A", 64), strings.Repeat("a", 65)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseSum(b)
		if err != nil {
			return
		}
		if len(s) != 64 || strings.Trim(s, "0123456789abcdef") != "" {
			t.Fatalf("accepted %q as %q", b, s)
		}
	})
}

func TestOneTransferPerVM(t *testing.T) {
	px := &fakePx{dir: t.TempDir()}
	tr := New(px, Options{})
	unlock, err := tr.lockVM(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = tr.Upload(ctx, 100, &fakeGuest{}, "/f", strings.NewReader("x"), 1, 0o644)
	if !errors.Is(err, context.DeadlineExceeded) || len(px.calls) != 0 {
		t.Fatalf("got %v with calls %v, want a wait for the other transfer and no Proxmox call", err, px.calls)
	}
	// Another VM is not held up, and the lock is released after a transfer.
	g := &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")))}}
	if err := tr.Upload(context.Background(), 101, g, "/f", strings.NewReader("x"), 1, 0o644); err != nil {
		t.Fatal(err)
	}
	unlock()
	g = &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")))}}
	if err := tr.Upload(context.Background(), 100, g, "/f", strings.NewReader("x"), 1, 0o644); err != nil {
		t.Fatal(err)
	}
	g = &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")))}}
	if err := tr.Upload(context.Background(), 100, g, "/f", strings.NewReader("x"), 1, 0o644); err != nil {
		t.Fatalf("lock not released after a transfer: %v", err)
	}
	// Nothing is kept about a VMID between transfers (issue 34).
	tr.mu.Lock()
	left := len(tr.slots)
	tr.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d VM locks kept after every transfer ended", left)
	}
}

// followingGuest plays uploadScript: it follows the progress record in
// the image until the node says done, and checks the record's line.
type followingGuest struct {
	sandbox.Guest
	px   *fakePx
	size int64
	seen []int64 // counts in the order read
	line string
}

func (g *followingGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	if r.Argv[0] == "rm" {
		return &apitype.ExecResult{}, nil
	}
	ents, _ := os.ReadDir(g.px.dir)
	if len(ents) != 1 {
		return nil, fmt.Errorf("%d images", len(ents))
	}
	p := filepath.Join(g.px.dir, ents[0].Name())
	serial := r.Argv[8]
	for ctx.Err() == nil {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		rec := make([]byte, recordSize)
		_, err = f.ReadAt(rec, imageSize(g.size))
		f.Close()
		if err != nil {
			return nil, err
		}
		var n1, n2 int64
		var s, st, sum string
		line, _, _ := strings.Cut(string(bytes.TrimRight(rec, "\x00")), "\n")
		if k, _ := fmt.Sscanf(line, "pvei %s %d %d %s %s", &s, &n1, &n2, &st, &sum); k >= 4 && s == serial && n1 == n2 {
			if len(g.seen) == 0 || g.seen[len(g.seen)-1] != n1 {
				g.seen = append(g.seen, n1)
			}
			if st == "d" {
				g.line = line
				b, err := os.ReadFile(p)
				if err != nil {
					return nil, err
				}
				if got := sumOf(b[:g.size]); got != sum {
					return &apitype.ExecResult{ExitCode: exitChecksum, Stderr: []byte("mismatch")}, nil
				}
				return &apitype.ExecResult{Stdout: []byte(sum + "\n")}, nil
			}
		}
		time.Sleep(time.Millisecond)
	}
	return nil, ctx.Err()
}

func TestUploadFollowsRecord(t *testing.T) {
	size := int64(2*blockSize + 5)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	px := &fakePx{dir: t.TempDir()}
	g := &followingGuest{px: px, size: size}
	if err := New(px, Options{}).Upload(context.Background(), 100, g, "/root/f", bytes.NewReader(data), size, 0o600); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("pvei %s 3 3 d %s", g.line[5:21], sumOf(data))
	if g.line != want {
		t.Fatalf("done record %q, want %q", g.line, want)
	}
	for i := 1; i < len(g.seen); i++ {
		if g.seen[i] < g.seen[i-1] {
			t.Fatalf("block counts went back: %v", g.seen)
		}
	}
}
