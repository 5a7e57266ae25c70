package testvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A guest's block devices stand in for a VM's hot-plugged disks: the image
// is attached to a host loop device whose node is created in the guest's
// own /dev (a tmpfs in its mount namespace), with the link a real guest's
// udev makes under /dev/disk/by-id. The loop device's name is recorded in
// the guest's directory (blocks/<name>) so detach and StopGuest find it.

var reBlockName = regexp.MustCompile(`^[a-z][a-z0-9]{0,15}$`)
var reByID = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// InitPID returns the host pid of the guest's PID 1 (tini, in the guest's
// mount namespace and root), the only child of the unshare process.
func (g *Guest) InitPID() (int, error) {
	if g.cmd == nil || g.cmd.Process == nil {
		return 0, errors.New("guest has no process")
	}
	p := g.cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p, p))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0, fmt.Errorf("guest launcher %d has %d children, want 1", p, len(f))
	}
	return strconv.Atoi(f[0])
}

func (b *Bed) blockRecord(vmid int, name string) string {
	return filepath.Join(b.dir, "guests", strconv.Itoa(vmid), "blocks", name)
}

// AttachBlock makes the image file a block device of guest vmid:
// /dev/<name> in the guest and the link /dev/disk/by-id/<byID> to it. name
// is a short lower-case device name (e.g. "sdb"), byID the by-id link name
// (e.g. "scsi-0QEMU_QEMU_HARDDISK_<serial>").
func (b *Bed) AttachBlock(ctx context.Context, vmid int, image, name, byID string) (err error) {
	if !reBlockName.MatchString(name) || !reByID.MatchString(byID) {
		return fmt.Errorf("testvm: block device name %q or by-id name %q is not allowed", name, byID)
	}
	g, ok := b.Guest(vmid)
	if !ok {
		return fmt.Errorf("testvm: guest %d is not running", vmid)
	}
	rec := b.blockRecord(vmid, name)
	if _, err := os.Stat(rec); err == nil {
		return fmt.Errorf("testvm: guest %d already has block device %s", vmid, name)
	}
	pid, err := g.InitPID()
	if err != nil {
		return fmt.Errorf("testvm: guest %d: %w", vmid, err)
	}
	out, err := output(ctx, "losetup", "--find", "--show", "--", image)
	if err != nil {
		return fmt.Errorf("testvm: attach %s: %w", image, err)
	}
	loop := strings.TrimSpace(string(out))
	defer func() {
		if err != nil {
			_ = run(context.WithoutCancel(ctx), "losetup", "-d", loop)
		}
	}()
	var st unix.Stat_t
	if err := unix.Stat(loop, &st); err != nil {
		return fmt.Errorf("testvm: attach: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(rec), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(rec, []byte(loop), 0o600); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(rec)
		}
	}()
	script := `set -e; mkdir -p /dev/disk/by-id; mknod "/dev/$1" b "$2" "$3"; chmod 0660 "/dev/$1"; ln -sfn "../../$1" "/dev/disk/by-id/$4"`
	if err := runInGuest(ctx, "nsenter", "-t", strconv.Itoa(pid), "-m", "-r", "--wd=/", "/bin/sh", "-c", script, "attach",
		name, strconv.FormatUint(uint64(unix.Major(st.Rdev)), 10), strconv.FormatUint(uint64(unix.Minor(st.Rdev)), 10), byID); err != nil {
		return fmt.Errorf("testvm: guest %d: create %s: %w", vmid, name, err)
	}
	return nil
}

// DetachBlock removes the block device name from guest vmid (its node and
// by-id links, when the guest still runs) and frees its loop device.
func (b *Bed) DetachBlock(ctx context.Context, vmid int, name string) error {
	if !reBlockName.MatchString(name) {
		return fmt.Errorf("testvm: block device name %q is not allowed", name)
	}
	rec := b.blockRecord(vmid, name)
	loop, err := os.ReadFile(rec)
	if err != nil {
		return fmt.Errorf("testvm: guest %d has no block device %s", vmid, name)
	}
	var errs []error
	if g, ok := b.Guest(vmid); ok {
		if pid, err := g.InitPID(); err == nil {
			script := `for l in /dev/disk/by-id/*; do [ "$(readlink "$l")" = "../../$1" ] && rm -f "$l"; done; rm -f "/dev/$1"`
			if err := runInGuest(ctx, "nsenter", "-t", strconv.Itoa(pid), "-m", "-r", "--wd=/", "/bin/sh", "-c", script, "detach", name); err != nil {
				errs = append(errs, fmt.Errorf("remove %s in the guest: %w", name, err))
			}
		}
	}
	if err := run(ctx, "losetup", "-d", string(loop)); err != nil {
		errs = append(errs, err)
	} else {
		_ = os.Remove(rec)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testvm: guest %d: detach %s: %w", vmid, name, err)
	}
	return nil
}

// detachAllBlocks frees the loop devices of a guest that is gone.
func (b *Bed) detachAllBlocks(ctx context.Context, vmid int) {
	dir := filepath.Dir(b.blockRecord(vmid, "x"))
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		_ = b.DetachBlock(ctx, vmid, e.Name())
	}
}

// freeLoops detaches every loop device whose backing file lies under dir
// (images of a bed torn down with block devices still attached, even when
// the image was deleted meanwhile).
func freeLoops(ctx context.Context, dir string) {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if strings.HasPrefix(backing, filepath.Clean(dir)+"/") {
			dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
			_ = run(ctx, "losetup", "-d", dev)
		}
	}
}
