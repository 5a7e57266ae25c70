// Package atomicfile writes a file so that a reader sees either the old
// content or the new, never a part of it, and so that the new content
// survives a crash once Write returns: the bytes go to a temporary file in
// the same directory, which is given its mode (and owner), synced, renamed
// over the path, and then the directory itself is synced so the rename is
// on disk too. It is the one way pve-inspect persists state and config.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode perm. The directory must exist.
func Write(path string, data []byte, perm fs.FileMode) error {
	return WriteOwned(path, data, perm, -1, -1)
}

// WriteOwned is Write with an owner: uid and gid as for os.Chown (-1 keeps
// the writer's).
func WriteOwned(path string, data []byte, perm fs.FileMode, uid, gid int) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	if err := f.Chmod(perm.Perm()); err != nil {
		return err
	}
	if uid >= 0 || gid >= 0 {
		if err := f.Chown(uid, gid); err != nil {
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	serr := d.Sync()
	cerr := d.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
