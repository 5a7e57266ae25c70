// Package seedcheck reads a NoCloud seed back from a disk image or block
// device and summarises it. The boot test's guest init and the test itself
// use it, so both sides compare the same digest.
package seedcheck

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// Summary is "label=L user-data=SHA meta-data=SHA" for a seed.
func Summary(label string, userData, metaData []byte) string {
	u, m := sha256.Sum256(userData), sha256.Sum256(metaData)
	return fmt.Sprintf("label=%s user-data=%s meta-data=%s", label, hex.EncodeToString(u[:8]), hex.EncodeToString(m[:8]))
}

// Read opens an ISO 9660 seed (file or block device) read-only and returns
// its Summary.
func Read(path string) (string, error) {
	b, err := file.OpenFromPath(path, true)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer b.Close()
	size, err := b.Seek(0, io.SeekEnd)
	if err != nil {
		return "", fmt.Errorf("size of %s: %w", path, err)
	}
	fsys, err := iso9660.Read(b, size, 0, 2048)
	if err != nil {
		return "", fmt.Errorf("%s: not an ISO 9660 file system: %w", path, err)
	}
	files := map[string][]byte{}
	for _, name := range []string{"user-data", "meta-data"} {
		f, err := fsys.OpenFile("/"+name, os.O_RDONLY)
		if err != nil {
			return "", fmt.Errorf("%s: %s: %w", path, name, err)
		}
		b, err := io.ReadAll(io.LimitReader(f, 1<<20))
		f.Close()
		if err != nil {
			return "", fmt.Errorf("%s: %s: %w", path, name, err)
		}
		files[name] = b
	}
	return Summary(strings.TrimRight(fsys.Label(), "\x00 "), files["user-data"], files["meta-data"]), nil
}
