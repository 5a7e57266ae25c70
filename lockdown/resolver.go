package lockdown

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// Names of the backup files under the backup directory. The record is
// written last and removed first: it is the commit point of a backup.
const (
	backupContentName = "lockdown-resolv.orig"
	backupRecordName  = "lockdown-resolv.json"
)

// backupRecord describes the resolver file as it was before the lockdown.
type backupRecord struct {
	Path       string `json:"path"`
	Existed    bool   `json:"existed"`
	Symlink    string `json:"symlink,omitempty"` // link target when it was a symlink
	Mode       uint32 `json:"mode"`              // permission bits of a regular file
	UID        int    `json:"uid"`
	GID        int    `json:"gid"`
	CreatedDir bool   `json:"created_dir"` // the directory did not exist either
}

// The reference scripts' lockdown blanks the resolver file to a line
// carrying ReferenceComment and keeps the original beside it, at the
// resolver path plus ReferenceBackupSuffix.
const (
	ReferenceComment      = "inspect-proxmox-egress-lockdown:"
	ReferenceBackupSuffix = ".inspect-egress-backup"
)

// resolverFile blanks and restores the resolver file.
type resolverFile struct {
	path    string
	content string // backup content file
	record  string // backup record file
	blank   []byte
}

func newResolverFile(path, backupDir, marker string) *resolverFile {
	return &resolverFile{
		path:    path,
		content: filepath.Join(backupDir, backupContentName),
		record:  filepath.Join(backupDir, backupRecordName),
		blank:   BlankContent(marker),
	}
}

// BlankContent is the single comment line the resolver file holds while the
// lockdown is in force.
func BlankContent(marker string) []byte {
	return []byte("# pve-inspectd: egress lockdown in force (marker " + marker + "); upstream resolvers withheld\n")
}

// Blanked reports whether the resolver file holds exactly our comment line.
func (r *resolverFile) Blanked() (bool, error) {
	fi, err := os.Lstat(r.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("resolver: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return false, nil
	}
	b, err := os.ReadFile(r.path)
	if err != nil {
		return false, fmt.Errorf("resolver: %w", err)
	}
	return bytes.Equal(b, r.blank), nil
}

// Blank backs the resolver file up (once: an existing backup is kept, it
// holds the content from before the lockdown) and replaces it with the
// comment line. changed reports whether it wrote the file.
func (r *resolverFile) Blank() (changed bool, err error) {
	rec, ok, err := r.readRecord()
	if err != nil {
		return false, err
	}
	if !ok {
		if rec, err = r.backup(); err != nil {
			return false, err
		}
	}
	if done, err := r.Blanked(); err != nil {
		return false, err
	} else if done {
		return false, nil
	}
	if rec.CreatedDir {
		if err := os.MkdirAll(filepath.Dir(r.path), 0o755); err != nil {
			return false, fmt.Errorf("blank resolver: %w", err)
		}
	}
	mode := fs.FileMode(0o644)
	uid, gid := -1, -1
	if rec.Existed && rec.Symlink == "" {
		mode, uid, gid = fs.FileMode(rec.Mode), rec.UID, rec.GID
	}
	if err := atomicfile.WriteOwned(r.path, r.blank, mode, uid, gid); err != nil {
		return false, fmt.Errorf("blank resolver: %w", err)
	}
	return true, nil
}

// backup saves the resolver file's content and a record of it.
func (r *resolverFile) backup() (backupRecord, error) {
	rec := backupRecord{Path: r.path, UID: -1, GID: -1}
	fi, err := os.Lstat(r.path)
	var content []byte
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, derr := os.Stat(filepath.Dir(r.path)); errors.Is(derr, os.ErrNotExist) {
			rec.CreatedDir = true
		}
	case err != nil:
		return rec, fmt.Errorf("back up resolver: %w", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		rec.Existed = true
		if rec.Symlink, err = os.Readlink(r.path); err != nil {
			return rec, fmt.Errorf("back up resolver: %w", err)
		}
	case fi.Mode().IsRegular():
		rec.Existed = true
		rec.Mode = uint32(fi.Mode().Perm())
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			rec.UID, rec.GID = int(st.Uid), int(st.Gid)
		}
		if content, err = os.ReadFile(r.path); err != nil {
			return rec, fmt.Errorf("back up resolver: %w", err)
		}
		// Taking over from the reference scripts while their lockdown is in
		// force: the file holds their blank line and the original sits in
		// their backup. That original is what a lift must restore.
		if bytes.Contains(content, []byte(ReferenceComment)) {
			if orig, err := os.ReadFile(r.path + ReferenceBackupSuffix); err == nil {
				content = orig
			}
		}
	default:
		return rec, fmt.Errorf("back up resolver: %s is a %v, not a file", r.path, fi.Mode().Type())
	}
	recb, err := json.Marshal(rec)
	if err != nil {
		return rec, fmt.Errorf("back up resolver: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(r.record), 0o755); err != nil {
		return rec, fmt.Errorf("back up resolver: %w", err)
	}
	if err := atomicfile.Write(r.content, content, 0o600); err != nil {
		return rec, fmt.Errorf("back up resolver: %w", err)
	}
	if err := atomicfile.Write(r.record, recb, 0o600); err != nil {
		return rec, fmt.Errorf("back up resolver: %w", err)
	}
	return rec, nil
}

// readRecord loads the backup record; ok is false when there is none.
func (r *resolverFile) readRecord() (rec backupRecord, ok bool, err error) {
	b, err := os.ReadFile(r.record)
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("resolver backup record: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("resolver backup record %s: %w", r.record, err)
	}
	if filepath.Clean(rec.Path) != r.path {
		return rec, false, fmt.Errorf("resolver backup record %s is for %q, not %q", r.record, rec.Path, r.path)
	}
	return rec, true, nil
}

// Restore puts the resolver file back as it was before the lockdown
// (byte-identical, same mode and owner; removed when it did not exist) and
// deletes the backup. changed reports whether it touched the resolver
// file. Without a backup it does nothing.
func (r *resolverFile) Restore() (changed bool, err error) {
	rec, ok, err := r.readRecord()
	if err != nil {
		return false, err
	}
	if !ok {
		// A content file without a record is a backup interrupted before
		// its commit point: the resolver was never blanked from it.
		if err := os.Remove(r.content); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("remove stale resolver backup: %w", err)
		}
		return false, nil
	}
	switch {
	case rec.Existed && rec.Symlink != "":
		tmp := r.path + ".pve-inspectd-link"
		_ = os.Remove(tmp)
		if err := os.Symlink(rec.Symlink, tmp); err != nil {
			return false, fmt.Errorf("restore resolver: %w", err)
		}
		if err := os.Rename(tmp, r.path); err != nil {
			_ = os.Remove(tmp)
			return false, fmt.Errorf("restore resolver: %w", err)
		}
	case rec.Existed:
		content, err := os.ReadFile(r.content)
		if err != nil {
			return false, fmt.Errorf("restore resolver: backup content: %w", err)
		}
		if err := atomicfile.WriteOwned(r.path, content, fs.FileMode(rec.Mode), rec.UID, rec.GID); err != nil {
			return false, fmt.Errorf("restore resolver: %w", err)
		}
	default:
		if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("restore resolver: remove blanked file: %w", err)
		}
		if rec.CreatedDir {
			// Only when empty: anything else in it is not ours.
			if err := os.Remove(filepath.Dir(r.path)); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
				return true, fmt.Errorf("restore resolver: remove directory we created: %w", err)
			}
		}
	}
	if err := os.Remove(r.record); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fmt.Errorf("remove resolver backup record: %w", err)
	}
	if err := os.Remove(r.content); err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fmt.Errorf("remove resolver backup: %w", err)
	}
	return true, nil
}

// BackupRecordPath is where the lockdown keeps the record of its resolver
// backup under backupDir.
func BackupRecordPath(backupDir string) string { return filepath.Join(backupDir, backupRecordName) }
