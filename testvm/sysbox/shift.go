package sysbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// shiftFile marks a complete shifted root; it holds the offset.
const shiftFile = ".sysbox-shift"

// idRange is how many ids of a root are shifted: an unprivileged
// container's idmap maps 65536 of them (pve-container LXC.pm
// update_lxc_config: "lxc.idmap = u 0 100000 65536").
const idRange = 65536

// ShiftedRootfsPath returns where the root for o shifted by offset is (or
// would be) cached.
func ShiftedRootfsPath(o RootfsOptions, offset uint32) string {
	return o.RootfsPath() + "-shift" + strconv.FormatUint(uint64(offset), 10)
}

// EnsureShiftedRootfs returns a cached copy of the root for o (built first
// by EnsureRootfs when missing) whose every file's owner and group are
// shifted up by offset: the root file system of an unprivileged container
// whose idmap maps 0 to offset, as pve-container lays one out (its
// restore_archive unpacks a template through the container's idmap, so
// root's files are owned by 100000 on the node). Set-id bits survive the
// shift. A root with file capabilities or ACLs (extended attributes that
// hold ids) is refused: this shifter does not rewrite them, and the bed's
// roots have none. The returned directory must be treated as read only.
func EnsureShiftedRootfs(ctx context.Context, o RootfsOptions, offset uint32) (string, error) {
	o = o.withDefaults()
	if offset == 0 || uint64(offset)+idRange > 1<<32-1 {
		return "", fmt.Errorf("rootfs: shift offset %d out of range", offset)
	}
	base, err := EnsureRootfs(ctx, o)
	if err != nil {
		return "", err
	}
	return cached(ctx, ShiftedRootfsPath(o, offset), completeShift, func(tmp string) error {
		return buildShifted(ctx, base, tmp, offset)
	})
}

func completeShift(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, shiftFile))
	return err == nil
}

func buildShifted(ctx context.Context, base, dir string, offset uint32) error {
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--", base, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("rootfs: copy %s: %w: %s", base, err, strings.TrimSpace(string(out)))
	}
	if err := ShiftTree(dir, offset); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, shiftFile), []byte(strconv.FormatUint(uint64(offset), 10)+"\n"), 0o644); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}

// ShiftTree adds offset to the owner and group of every file under dir
// (dir itself included; symbolic links are changed, never followed),
// keeping set-id bits, which chown clears, and shifting the named users
// and groups of POSIX ACLs (systemd's /var/log/journal has some); a file
// with several hard links is shifted once. Ids at or above 65536 and file
// capabilities (security.capability, whose v3 form carries a root id) are
// refused.
func ShiftTree(dir string, offset uint32) error {
	type inode struct{ dev, ino uint64 }
	done := map[inode]bool{}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("rootfs: shift: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("rootfs: shift: %w", err)
		}
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			k := inode{st.Dev, st.Ino}
			if done[k] {
				return nil
			}
			done[k] = true
		}
		if st.Uid >= idRange || st.Gid >= idRange {
			return fmt.Errorf("rootfs: shift: %s: owner %d:%d is outside the mapped range", p, st.Uid, st.Gid)
		}
		acls, err := idXattrs(p)
		if err != nil {
			return err
		}
		if err := unix.Lchown(p, int(st.Uid+offset), int(st.Gid+offset)); err != nil {
			return fmt.Errorf("rootfs: shift: %w", err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
				return fmt.Errorf("rootfs: shift: %w", err)
			}
		}
		for _, name := range acls {
			if err := shiftACL(p, name, offset); err != nil {
				return err
			}
		}
		return nil
	})
}

// idXattrs returns the POSIX ACL attributes of a file, and fails for one
// with file capabilities.
func idXattrs(p string) ([]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, syscall.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rootfs: shift: list xattrs of %s: %w", p, err)
	}
	var acls []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		switch {
		case name == "security.capability":
			return nil, fmt.Errorf("rootfs: shift: %s has %s, which this shifter does not rewrite", p, name)
		case name == "system.posix_acl_access" || name == "system.posix_acl_default":
			acls = append(acls, name)
		}
	}
	return acls, nil
}

// POSIX ACL extended attribute layout (linux/posix_acl_xattr.h): a
// little-endian u32 version 2, then entries of u16 tag, u16 permissions
// and u32 id; the named user (ACL_USER) and group (ACL_GROUP) entries
// carry ids.
const (
	aclVersion = 2
	aclUser    = 0x02
	aclGroup   = 0x08
	aclEntry   = 8
)

// shiftACL adds offset to the ids of the named entries of ACL attribute
// name of p.
func shiftACL(p, name string, offset uint32) error {
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return fmt.Errorf("rootfs: shift: %s %s: %w", p, name, err)
	}
	acl := buf[:n]
	if len(acl) < 4 || binary.LittleEndian.Uint32(acl) != aclVersion || (len(acl)-4)%aclEntry != 0 {
		return fmt.Errorf("rootfs: shift: %s %s: not a version 2 ACL", p, name)
	}
	for e := acl[4:]; len(e) > 0; e = e[aclEntry:] {
		if tag := binary.LittleEndian.Uint16(e); tag == aclUser || tag == aclGroup {
			id := binary.LittleEndian.Uint32(e[4:])
			if id >= idRange {
				return fmt.Errorf("rootfs: shift: %s %s: id %d is outside the mapped range", p, name, id)
			}
			binary.LittleEndian.PutUint32(e[4:], id+offset)
		}
	}
	if err := unix.Lsetxattr(p, name, acl, 0); err != nil {
		return fmt.Errorf("rootfs: shift: %s %s: %w", p, name, err)
	}
	return nil
}
