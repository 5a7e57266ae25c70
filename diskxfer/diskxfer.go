// Package diskxfer moves large files between the node and a VM through a
// hot-plugged disk instead of the guest agent's JSON channel: the daemon
// (on the node) allocates a raw image on a Proxmox storage, attaches it to
// the running VM with a serial, writes the bytes into it, and one guest
// exec copies between the disk (found under /dev/disk/by-id by the name
// the VM's machine version gives it, diskname.go) and the guest file; the
// disk is then unplugged with force, which frees the image. A VM whose
// hotplug option lacks disk is refused first (Proxmox would keep the disk
// pending and the guest would never see it), and so is one whose SCSI
// controller never tells the guest of a hot-plugged disk (lsi, the
// default, and megasas). No image is freed while a key of the VM's
// config, current or pending, still names it (release). Integrity is
// checked by sha256 on both sides. Downloads run the same steps in
// reverse. DESIGN.md section 10, ISSUE 18.
//
// Where the time goes (image.go, progress.go, the scripts): every byte is
// moved once on each side in 4 MiB blocks, hashed while it moves (a second
// goroutine on the node, openssl where the guest has it), with O_DIRECT on
// the guest's disk and no fsync on either side; an upload's guest copy
// follows the node's writing through a progress record in the image
// instead of waiting for the whole body. Each transfer logs its phases at
// debug level.
package diskxfer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// Proxmox is what a transfer needs from the Proxmox API; pveapi
// implements it.
type Proxmox interface {
	// AllocVolume allocates a raw image of at least size bytes named name
	// (vm-<vmid>-*.raw) on storage and returns its volume id.
	AllocVolume(ctx context.Context, storage string, vmid int, name string, size int64) (string, error)
	// VolumePath is the volume's path on the node.
	VolumePath(ctx context.Context, volid string) (string, error)
	// FreeVolume deletes a volume no VM config refers to.
	FreeVolume(ctx context.Context, volid string) error
	// DiskConfig returns the running VM's config as it runs (current)
	// and as it will be with its pending changes (pending: values only
	// pending included, keys whose deletion is pending left out).
	DiskConfig(ctx context.Context, vmid int) (current, pending map[string]string, err error)
	// RunningQEMU returns the QEMU version the running VM uses ("10.1.2").
	RunningQEMU(ctx context.Context, vmid int) (string, error)
	// AttachVolume hot-plugs volid as disk slot with serial. A hot-plug
	// that fails leaves the disk pending in the VM's config.
	AttachVolume(ctx context.Context, vmid int, slot, volid, serial string) error
	// DetachVolume deletes disk slot with force: a plugged disk is
	// unplugged and its volume freed, an unusedN's volume freed. An
	// unplug that fails leaves the deletion pending.
	DetachVolume(ctx context.Context, vmid int, slot string) error
	// RevertPending drops the pending changes of the VM's config keys: a
	// pending deletion is cancelled, a disk only pending goes and its
	// volume becomes unusedN.
	RevertPending(ctx context.Context, vmid int, keys ...string) error
}

// Options configure a Transfer.
type Options struct {
	// Storage is the Proxmox storage the images go to ("local", a dir
	// storage, by default). The daemon writes and reads the image at the
	// path Proxmox reports, so the storage must be reachable from the node
	// as a file or block device (dir, lvm, lvm-thin, zfs).
	Storage string
	// Timeout bounds the guest's copy (30 minutes by default).
	Timeout time.Duration
	// Logger receives cleanup failures (discarded when nil).
	Logger *slog.Logger
}

// Transfer moves files through a hot-plugged disk. It implements
// sandbox.DiskTransfer.
type Transfer struct {
	px Proxmox
	o  Options

	mu    sync.Mutex      // guards slots
	slots map[int]*vmSlot // one transfer per VM at a time: slot choice and attach
}

// vmSlot is one VM's transfer lock and the number of its holder and
// waiters; the entry goes when the last of them leaves, so nothing is kept
// about a VMID between transfers (Proxmox gives a freed VMID to the next
// clone).
type vmSlot struct {
	ch   chan struct{}
	refs int
}

// lockVM serializes transfers to one VM (two would pick the same free
// slot, and setting a used slot replaces that disk).
func (t *Transfer) lockVM(ctx context.Context, vmid int) (func(), error) {
	t.mu.Lock()
	sl := t.slots[vmid]
	if sl == nil {
		sl = &vmSlot{ch: make(chan struct{}, 1)}
		t.slots[vmid] = sl
	}
	sl.refs++
	t.mu.Unlock()
	leave := func() {
		t.mu.Lock()
		if sl.refs--; sl.refs == 0 {
			delete(t.slots, vmid)
		}
		t.mu.Unlock()
	}
	select {
	case sl.ch <- struct{}{}:
		return func() { <-sl.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, fmt.Errorf("disk transfer: wait for the VM's other transfer: %w", ctx.Err())
	}
}

// New returns a Transfer over px.
func New(px Proxmox, o Options) *Transfer {
	if o.Storage == "" {
		o.Storage = "local"
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Transfer{px: px, o: o, slots: map[int]*vmSlot{}}
}

// Exit codes of the guest scripts.
const (
	exitNoDevice = 90 // the disk did not appear under /dev/disk/by-id
	exitWrite    = 91 // writing the destination failed (full file system, ...)
	exitChecksum = 92 // the bytes read from the disk do not match
	exitSource   = 93 // the source file cannot be read
)

// blockSize is the unit of image I/O: the node's buffers and the guest's
// dd blocks (the scripts' 4M and 4194304). Images are allocated in whole
// blocks, so the guest writes only full, aligned blocks (O_DIRECT needs
// them).
const blockSize = 4 << 20

// imageSize is the image allocated for a transfer of size bytes: whole
// blocks, at least one.
func imageSize(size int64) int64 {
	return max((size+blockSize-1)/blockSize, 1) * blockSize
}

// findDisk waits up to 30 s for the link /dev/disk/by-id/$1 and sets dev;
// it also sets H to the fastest sha256 tool that gives the right digest
// (openssl uses the CPU's SHA extensions, coreutils' sha256sum does not:
// about 1 GB/s against 0.27 GB/s here).
const findDisk = `dev=""; i=0
while [ "$i" -lt 300 ]; do
  [ -b "/dev/disk/by-id/$1" ] && dev=/dev/disk/by-id/$1
  [ -n "$dev" ] && break
  sleep 0.1; i=$((i+1))
done
[ -n "$dev" ] || { echo "pve-inspect: the transfer disk $1 did not appear in the guest" >&2; exit 90; }
H=sha256sum
case $(openssl dgst -sha256 -r </dev/null 2>/dev/null) in
e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855*) H="openssl dgst -sha256 -r" ;;
esac
blocks=$((($2 + 4194303) / 4194304))
`

// uploadScript: $1 by-id name, $2 size, $3 destination, $4 mode (octal),
// $5 the transfer's serial (in the progress record and the temp name).
// It runs while the node writes the image and follows the node's progress
// record (progress.go) in the 4 KiB after the data blocks: it copies each
// block once the record counts it, in one pass (4 MiB direct reads, so the
// disk's blocks do not go through the guest's page cache, then tee and
// hash) into a temp file beside the destination, until the record says
// done and carries the node's sha256. It then checks the file's size and
// the stream's sha256 against the node's and renames the file. A device
// that refuses O_DIRECT is read buffered, its cached blocks dropped
// before every read of the record.
const uploadScript = findDisk + `serial=$5
d=$(dirname -- "$3")
mkdir -p -- "$d" 2>/dev/null
tmp="$d/.pve-inspect-xfer-$serial"
trap 'rm -f -- "$tmp"' EXIT
in="iflag=direct"
dd if="$dev" of=/dev/null bs=4096 count=1 $in status=none 2>/dev/null || in=""
rec=$((blocks * 1024))
[ "$rec" -gt 0 ] || rec=1024
progress() {
  [ -n "$in" ] || blockdev --flushbufs "$dev" 2>/dev/null
  set -- $(dd if="$dev" bs=4096 skip="$rec" count=1 $in status=none | tr -d '\000' | head -n 1)
  pn=0 st=w want=
  [ "$1 $2" = "pvei $serial" ] && [ "$3" = "$4" ] || return 0
  case $3 in ''|*[!0-9]*) return 0 ;; esac
  pn=$3 st=$5 want=$6
}
sum=$(got=0; while :; do
  progress
  [ "$st" = x ] && exit 1
  if [ "$pn" -gt "$got" ]; then
    dd if="$dev" bs=4M skip="$got" count=$((pn - got)) $in status=none || exit 1
    got=$pn
  elif [ "$st" = d ]; then
    break
  else
    sleep 0.05
  fi
done | head -c "$2" | tee -- "$tmp" | $H) || exit 91
progress
[ "$st" = d ] || { echo "pve-inspect: the node did not finish the transfer image" >&2; exit 91; }
n=$(stat -c %s -- "$tmp" 2>/dev/null) || n=-1
[ "$n" = "$2" ] || { echo "pve-inspect: copying to $3 stopped after $n of $2 bytes (file system full?)" >&2; exit 91; }
sum=${sum%% *}
[ "$sum" = "$want" ] || { echo "pve-inspect: checksum mismatch in the guest: $sum" >&2; exit 92; }
chmod "$4" -- "$tmp" && mv -f -- "$tmp" "$3" || exit 91
trap - EXIT
echo "$sum"
`

// downloadScript: $1 by-id name, $2 size, $3 source. Copies the source onto
// the disk in whole 4 MiB blocks (the last one padded with zeros) while
// hashing it, and prints the source's sha256. The copy writes with
// O_DIRECT: the blocks are in the image when dd returns, with no guest
// page cache to flush (a device that refuses O_DIRECT gets buffered
// writes and an fsync).
const downloadScript = findDisk + `[ -r "$3" ] && [ -f "$3" ] || { echo "pve-inspect: cannot read $3" >&2; exit 93; }
( dd if="$3" of="$dev" bs=4M count="$2" iflag=count_bytes,fullblock oflag=direct conv=sync,notrunc status=none 2>/dev/null ||
  dd if="$3" of="$dev" bs=4M count="$2" iflag=count_bytes,fullblock conv=sync,notrunc,fsync status=none ) &
cp=$!
sum=$(head -c "$2" -- "$3" | $H) || { wait "$cp"; exit 93; }
wait "$cp" || { echo "pve-inspect: writing the transfer disk failed" >&2; exit 91; }
echo "${sum%% *}"
`

var reSum = regexp.MustCompile(`^[0-9a-f]{64}\n?$`)

// parseSum checks the script's stdout: one sha256 in hex.
func parseSum(out []byte) (string, error) {
	if !reSum.Match(out) {
		return "", fmt.Errorf("%w: the guest's copy printed %q, not a sha256", sandbox.ErrGuestProtocol, clip(out))
	}
	return strings.TrimSuffix(string(out), "\n"), nil
}

func clip(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// volume is one transfer image and where it is.
type volume struct {
	vmid         int
	volid, slot  string
	serial, path string
	byID         string // the disk's /dev/disk/by-id name in the guest
	// plugTried: a hot-plug was asked for (the config may name the
	// image, pending); attached: it succeeded; done: cleaned up.
	plugTried, attached, done bool
	unlock                    func()
}

// setup allocates the image, finds a free slot and learns the image's path.
func (t *Transfer) setup(ctx context.Context, vmid int, size int64) (*volume, error) {
	unlock, err := t.lockVM(ctx, vmid)
	if err != nil {
		return nil, err
	}
	v, err := t.setupLocked(ctx, vmid, size)
	if err != nil {
		unlock()
		return nil, err
	}
	v.unlock = unlock
	return v, nil
}

func (t *Transfer) setupLocked(ctx context.Context, vmid int, size int64) (*volume, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	v := &volume{vmid: vmid, serial: "pvei" + tag}
	conf, pending, err := t.px.DiskConfig(ctx, vmid)
	if err != nil {
		return nil, fmt.Errorf("disk transfer: %w", err)
	}
	if !hotplugsDisks(conf["hotplug"]) {
		return nil, fmt.Errorf("disk transfer: %w: VM %d's hotplug option %q lacks disk, so a hot-plugged disk would stay pending until the next start; add disk to the template's hotplug (qm set ID --hotplug network,disk,usb)",
			sandbox.ErrNotConfigured, vmid, conf["hotplug"])
	}
	if !SCSIHotplug(conf["scsihw"]) {
		return nil, fmt.Errorf("disk transfer: %w: VM %d's SCSI controller %s cannot hot-plug disks: Proxmox plugs the transfer disk and reports success, but the controller never tells the guest, which would not see it; give the template a virtio SCSI controller (qm set ID --scsihw virtio-scsi-single)",
			sandbox.ErrNotConfigured, vmid, scsihwName(conf["scsihw"]))
	}
	for i := 1; i <= 30 && v.slot == ""; i++ {
		k := "scsi" + strconv.Itoa(i)
		if _, cur := conf[k]; !cur {
			if _, pend := pending[k]; !pend {
				v.slot = k
			}
		}
	}
	if v.slot == "" {
		return nil, errors.New("disk transfer: no free scsi slot on the VM")
	}
	if v.byID, err = t.diskName(ctx, vmid, conf["machine"], v.slot, v.serial); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("vm-%d-pvei-%s.raw", vmid, tag)
	if v.volid, err = t.px.AllocVolume(ctx, t.o.Storage, vmid, name, imageSize(size)+blockSize); err != nil {
		return nil, fmt.Errorf("disk transfer: %w", err)
	}
	if v.path, err = t.px.VolumePath(ctx, v.volid); err != nil {
		t.cleanup(ctx, v)
		return nil, fmt.Errorf("disk transfer: %w", err)
	}
	return v, nil
}

// detachTries is how often an unplug is tried before the image is left
// plugged.
const detachTries = 3

// cleanup unplugs (and so frees) the image, or frees it when no config
// names it. It runs on a fresh context so a cancelled request still
// cleans up, and returns what failed.
func (t *Transfer) cleanup(ctx context.Context, v *volume) error {
	if v.unlock != nil {
		defer v.unlock()
		v.unlock = nil
	}
	if v.done {
		return nil
	}
	v.done = true
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var err error
	switch {
	case v.attached:
		// the common case: one unplug frees the image
		if err = t.px.DetachVolume(ctx, v.vmid, v.slot); err == nil {
			return nil
		}
		t.o.Logger.Warn("disk transfer: detach failed", "vmid", v.vmid, "slot", v.slot, "try", 1, "err", err)
		err = t.release(ctx, v.vmid, v.volid, detachTries-1)
	case v.plugTried:
		err = t.release(ctx, v.vmid, v.volid, detachTries)
	default:
		if err = t.px.FreeVolume(ctx, v.volid); err != nil {
			err = fmt.Errorf("free %s: %w", v.volid, err)
		}
	}
	if err != nil {
		t.o.Logger.Error("disk transfer: image left on the node", "volid", v.volid, "err", err)
	}
	return err
}

// volumeRefs are the keys of a VM's config that name one volume.
type volumeRefs struct {
	// pending: keys with a pending change that names the volume or
	// drops it (a value only pending, a pending deletion).
	pending []string
	// plugged is the disk key that holds it now, unused the unusedN.
	plugged, unused string
}

// refsTo finds volid in VM vmid's config, current and pending.
func (t *Transfer) refsTo(ctx context.Context, vmid int, volid string) (volumeRefs, error) {
	var r volumeRefs
	cur, pend, err := t.px.DiskConfig(ctx, vmid)
	if err != nil {
		return r, err
	}
	names := func(val string) bool { file, _, _ := strings.Cut(val, ","); return file == volid }
	for _, k := range sortedKeys(cur, pend) {
		c, inCur := cur[k]
		p, inPend := pend[k]
		switch {
		case inCur && names(c) && (!inPend || p != c), inPend && names(p) && c != p:
			r.pending = append(r.pending, k)
		case inCur && names(c) && strings.HasPrefix(k, "unused"):
			r.unused = k
		case inCur && names(c):
			r.plugged = k
		}
	}
	return r, nil
}

// sortedKeys is the keys of the maps, sorted, without repeats.
func sortedKeys(ms ...map[string]string) []string {
	var out []string
	for _, m := range ms {
		for k := range m {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// release frees volid, an image of VM vmid, so that no key of the VM's
// config, current or pending, names a freed volume (the VM's next start,
// or a rollback, would fail on it). qemu-server keeps a disk whose
// hot-plug failed pending, and a deletion whose unplug failed
// (vmconfig_hotplug_pending); so release first reverts every pending
// change naming the image (a disk only pending then becomes unusedN),
// then unplugs a disk still holding it (up to tries times; when that
// keeps failing the deletion is reverted and the image stays plugged, to
// go with the VM), deletes an unusedN naming it (which frees it), or
// frees it through the storage when no key names it.
func (t *Transfer) release(ctx context.Context, vmid int, volid string, tries int) error {
	r, err := t.refsTo(ctx, vmid, volid)
	if err != nil {
		return fmt.Errorf("find %s in VM %d's config: %w", volid, vmid, err)
	}
	if len(r.pending) > 0 {
		if err := t.px.RevertPending(ctx, vmid, r.pending...); err != nil {
			return fmt.Errorf("revert the pending %s of VM %d (image %s kept): %w", strings.Join(r.pending, ","), vmid, volid, err)
		}
		if r, err = t.refsTo(ctx, vmid, volid); err != nil {
			return fmt.Errorf("find %s in VM %d's config: %w", volid, vmid, err)
		}
	}
	switch {
	case r.plugged != "":
		var derr error
		for i := range tries {
			if derr = t.px.DetachVolume(ctx, vmid, r.plugged); derr == nil {
				return nil
			}
			t.o.Logger.Warn("disk transfer: detach failed", "vmid", vmid, "slot", r.plugged, "try", i+2, "err", derr)
			time.Sleep(time.Duration(i+1) * 500 * time.Millisecond)
		}
		// each failed unplug left the deletion pending
		if err := t.px.RevertPending(ctx, vmid, r.plugged); err != nil {
			derr = errors.Join(derr, fmt.Errorf("revert the pending deletion: %w", err))
		}
		return fmt.Errorf("detach %s from %d: image %s stays plugged (it goes with the VM): %w", r.plugged, vmid, volid, derr)
	case r.unused != "":
		if err := t.px.DetachVolume(ctx, vmid, r.unused); err != nil {
			return fmt.Errorf("free %s (%s of VM %d): %w", volid, r.unused, vmid, err)
		}
		return nil
	}
	if err := t.px.FreeVolume(ctx, volid); err != nil {
		return fmt.Errorf("free %s: %w", volid, err)
	}
	return nil
}

// attach hot-plugs the image into the VM. A hot-plug Proxmox refuses
// leaves the disk pending in the VM's config; the cleanup reverts it
// before the image is freed.
//
// The hot-plug runs on a context the caller cannot cancel (bounded by
// attachBound): a wait given up while Proxmox's config task runs on would
// let the cleanup find no key naming the image yet and free it, and the
// task would then record a disk on a freed volume.
func (t *Transfer) attach(ctx context.Context, v *volume, ph *phases) error {
	v.plugTried = true
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attachBound)
	defer cancel()
	if err := t.px.AttachVolume(actx, v.vmid, v.slot, v.volid, v.serial); err != nil {
		return fmt.Errorf("disk transfer: hot-plug of the transfer disk into VM %d as %s failed: %w", v.vmid, v.slot, err)
	}
	v.attached = true
	ph.mark("attach")
	return nil
}

// attachBound bounds a hot-plug's config task: qemu-server's device_add
// and its checks take seconds; minutes mean the node is in trouble.
const attachBound = 2 * time.Minute

// SCSIHotplug says whether a guest sees a SCSI disk hot-plugged on
// controller scsihw ("": qemu-server's default, lsi). qemu-server plugs
// one on every controller and reports success (vm_deviceplug), but only
// virtio-scsi and pvscsi tell the guest (QEMU's virtio_scsi_hotplug,
// pvscsi_hotplug); lsi, lsi53c810 and megasas have no hotplug handler,
// so the guest would not see the disk until it rescans the bus itself.
func SCSIHotplug(scsihw string) bool {
	switch scsihw {
	case "virtio-scsi-pci", "virtio-scsi-single", "pvscsi":
		return true
	}
	return false
}

func scsihwName(scsihw string) string {
	if scsihw == "" {
		return "lsi (the default)"
	}
	return scsihw
}

// run runs one guest script on the attached image.
func (t *Transfer) run(ctx context.Context, v *volume, g sandbox.Guest, script string, args ...string) (string, error) {
	argv := append([]string{"/bin/sh", "-c", script, "pve-inspect-xfer"}, args...)
	res, err := g.Exec(ctx, sandbox.GuestExec{Argv: argv, Timeout: int64(t.o.Timeout / time.Second), OutputLimit: 4096})
	if err != nil {
		return "", fmt.Errorf("disk transfer: guest copy: %w", err)
	}
	if res == nil {
		return "", fmt.Errorf("disk transfer: %w: the guest's copy returned no result", sandbox.ErrGuestProtocol)
	}
	msg := strings.TrimSpace(clip(res.Stderr))
	switch {
	case res.TimedOut:
		return "", fmt.Errorf("disk transfer: %w: the guest's copy did not finish in %v", sandbox.ErrGuestTimeout, t.o.Timeout)
	case res.ExitCode == exitNoDevice:
		return "", fmt.Errorf("disk transfer: %w: %s", sandbox.ErrGuestTimeout, msg)
	case res.ExitCode == exitWrite:
		return "", fmt.Errorf("disk transfer: %w: %s", sandbox.ErrGuestNoSpace, msg)
	case res.ExitCode == exitSource:
		return "", fmt.Errorf("disk transfer: %w: %s", sandbox.ErrPermission, msg)
	case res.ExitCode != 0:
		return "", fmt.Errorf("disk transfer: %w: guest copy exited %d: %s", sandbox.ErrGuestProtocol, res.ExitCode, msg)
	}
	return parseSum(res.Stdout)
}

// phases times the steps of one transfer for a debug log line, the
// profile of where a transfer's time goes.
type phases struct {
	lg    *slog.Logger
	op    string
	vmid  int
	size  int64
	last  time.Time
	attrs []any
}

func (t *Transfer) phases(op string, vmid int, size int64) *phases {
	return &phases{lg: t.o.Logger, op: op, vmid: vmid, size: size, last: time.Now()}
}

// mark ends the step named name.
func (p *phases) mark(name string) {
	now := time.Now()
	p.attrs = append(p.attrs, name, now.Sub(p.last).Round(time.Millisecond))
	p.last = now
}

func (p *phases) log(err error) {
	p.lg.Debug("disk transfer", append([]any{"op", p.op, "vmid", p.vmid, "bytes", p.size, "err", err}, p.attrs...)...)
}

// ChecksumError says the bytes on the two sides differ.
type ChecksumError struct{ Node, Guest string }

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("disk transfer: sha256 on the node %s, in the guest %s", e.Node, e.Guest)
}

// Upload writes exactly size bytes from r to the guest file p with mode.
// On any failure the guest file is untouched and the image is gone.
func (t *Transfer) Upload(ctx context.Context, vmid int, g sandbox.Guest, p string, r io.Reader, size int64, mode os.FileMode) (err error) {
	if !path.IsAbs(p) || size < 0 {
		return fmt.Errorf("%w: disk transfer needs an absolute path and a size", sandbox.ErrGuestInvalid)
	}
	ph := t.phases("upload", vmid, size)
	v, err := t.setup(ctx, vmid, size)
	if err != nil {
		return err
	}
	ph.mark("setup")
	defer func() {
		if cerr := t.cleanup(ctx, v); cerr != nil {
			err = errors.Join(err, fmt.Errorf("disk transfer: %w", cerr))
		}
		ph.mark("cleanup")
		ph.log(err)
	}()
	// The image is plugged while still zeros (the guest's udev probes
	// nothing of the file), then written while the guest copies it.
	if err := t.attach(ctx, v, ph); err != nil {
		return err
	}
	f, err := os.OpenFile(v.path, os.O_WRONLY, 0)
	if err != nil {
		return openImageError(v.path, err)
	}
	defer f.Close()
	got, want, err := t.copyUp(ctx, v, g, f, r, size, p, mode, ph)
	if err != nil {
		// A copy killed by its timeout or cancelled had no chance to
		// remove its temp file.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		tmp := path.Join(path.Dir(p), ".pve-inspect-xfer-"+v.serial)
		if _, rerr := g.Exec(rctx, sandbox.GuestExec{Argv: []string{"rm", "-f", "--", tmp}, Timeout: 60}); rerr != nil {
			t.o.Logger.Warn("disk transfer: remove guest temp file", "path", tmp, "err", rerr)
		}
		return err
	}
	if got != want {
		return &ChecksumError{Node: want, Guest: got}
	}
	return nil
}

// errGuestEnded stops the node's writing when the guest's copy ended first.
var errGuestEnded = errors.New("the guest's copy ended before the image was written")

// copyUp writes the image while the guest copies it (uploadScript) and
// returns the guest's and the node's sha256. The guest's copy runs in its
// own goroutine, which copyUp always waits for: a failed write records x
// and cancels the copy; a copy that ends early stops the write.
func (t *Transfer) copyUp(ctx context.Context, v *volume, g sandbox.Guest, f *os.File, r io.Reader, size int64, p string, mode os.FileMode, ph *phases) (got, want string, err error) {
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		sum string
		err error
	}
	res := make(chan result, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		sum, err := t.run(ectx, v, g, uploadScript, v.byID, strconv.FormatInt(size, 10), p, strconv.FormatUint(uint64(mode.Perm()), 8), v.serial)
		res <- result{sum, err}
	}()
	want, err = writeImage(f, r, size, func(blocks int64) error {
		select {
		case <-ended:
			return errGuestEnded
		default:
		}
		return writeRecord(f, size, v.serial, blocks, 'w', "")
	})
	if err == nil {
		err = writeRecord(f, size, v.serial, (size+blockSize-1)/blockSize, 'd', want)
	}
	ph.mark("write")
	if err != nil && !errors.Is(err, errGuestEnded) {
		if rerr := writeRecord(f, size, v.serial, 0, 'x', ""); rerr != nil {
			t.o.Logger.Warn("disk transfer: record the failure for the guest", "err", rerr)
		}
		cancel()
		<-res
		ph.mark("guest")
		return "", "", fmt.Errorf("disk transfer: %w", err)
	}
	gr := <-res
	ph.mark("guest")
	switch {
	case gr.err != nil:
		return "", "", gr.err
	case err != nil:
		return "", "", fmt.Errorf("disk transfer: %w: %w", sandbox.ErrGuestProtocol, err)
	}
	return gr.sum, want, nil
}

// Download copies the first size bytes of the guest file p to w: the
// guest writes them to the disk, the node checks their sha256 against the
// guest's before the first byte goes to w.
func (t *Transfer) Download(ctx context.Context, vmid int, g sandbox.Guest, p string, size int64, w io.Writer) (n int64, err error) {
	if !path.IsAbs(p) || size < 0 {
		return 0, fmt.Errorf("%w: disk transfer needs an absolute path and a size", sandbox.ErrGuestInvalid)
	}
	ph := t.phases("download", vmid, size)
	v, err := t.setup(ctx, vmid, size)
	if err != nil {
		return 0, err
	}
	ph.mark("setup")
	defer func() {
		if cerr := t.cleanup(ctx, v); cerr != nil {
			err = errors.Join(err, fmt.Errorf("disk transfer: %w", cerr))
		}
		ph.mark("cleanup")
		ph.log(err)
	}()
	if err := t.attach(ctx, v, ph); err != nil {
		return 0, err
	}
	got, err := t.run(ctx, v, g, downloadScript, v.byID, strconv.FormatInt(size, 10), p)
	ph.mark("guest")
	if err != nil {
		return 0, err
	}
	f, err := os.Open(v.path)
	if err != nil {
		return 0, openImageError(v.path, err)
	}
	defer f.Close()
	want, err := hashImage(f, size)
	if err != nil {
		return 0, fmt.Errorf("disk transfer: %w", err)
	}
	ph.mark("hash")
	if want != got {
		return 0, &ChecksumError{Node: want, Guest: got}
	}
	// From the file itself, so that an HTTP response can send it with
	// sendfile(2).
	n, err = io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return n, fmt.Errorf("disk transfer: send: %w", err)
	}
	ph.mark("send")
	return n, nil
}
