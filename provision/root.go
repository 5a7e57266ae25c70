package provision

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// Root is the file system root every host path is read and written under:
// "/" on a real machine, a fixture directory in tests.
type Root string

// Path maps an absolute host path into the root.
func (r Root) Path(p string) string {
	if r == "" || r == "/" {
		return p
	}
	return filepath.Join(string(r), p)
}

// ReadFile reads a host path.
func (r Root) ReadFile(p string) ([]byte, error) { return os.ReadFile(r.Path(p)) }

// Exists reports whether a host path exists.
func (r Root) Exists(p string) bool {
	_, err := os.Lstat(r.Path(p))
	return err == nil
}

// HasContent reports whether a host path holds exactly want (and mode perm).
func (r Root) HasContent(p string, want []byte, perm fs.FileMode) (bool, error) {
	fi, err := os.Stat(r.Path(p))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Mode().Perm() != perm {
		return false, nil
	}
	b, err := r.ReadFile(p)
	if err != nil {
		return false, err
	}
	return bytes.Equal(b, want), nil
}

// WriteFile writes a host path atomically (atomicfile), creating
// parent directories.
func (r Root) WriteFile(p string, data []byte, perm fs.FileMode) error {
	full := r.Path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := atomicfile.Write(full, data, perm); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// Remove removes a host path; a missing path is not an error.
func (r Root) Remove(p string) error {
	err := os.Remove(r.Path(p))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

func fsMode(perm uint32) fs.FileMode { return fs.FileMode(perm) }
