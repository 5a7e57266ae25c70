package templatebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// The ledger is the record of the VMs this node's builds made, kept by
// root on the node (NodeHost.StateDir, mode 0700): a build destroys, and
// reuses, only a VM its record names. Name and tags are VM.Config.Options
// that a user who may neither destroy a VM nor make a template can set
// (the daemon's sandbox token among them), so they alone never make a VM
// the build's.

// Build states a record holds.
const (
	// StateBuilding is a VM a build created and has not sealed.
	StateBuilding = "building"
	// StateTemplate is a template a build sealed.
	StateTemplate = "template"
)

// Record is the ledger's entry of one VM.
type Record struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// Image is the digest of the image a sealed template was built from
	// ("sha256:HEX", the algorithm its build checked), so that an upload
	// of another image under the name is not answered with this
	// template; "" for a record written before it was kept.
	Image string `json:"image,omitempty"`
	// Mode is how a sealed template was built (the zero Mode, booted, for
	// a record written before it was kept, when every build booted).
	Mode Mode `json:"mode,omitzero"`
}

// DefaultStateDir is where `template build` keeps its ledger.
const DefaultStateDir = "/var/lib/pve-inspectd/template-builds"

func (n NodeHost) recordPath(vmid int) (string, error) {
	if n.StateDir == "" {
		return "", errors.New("no state directory for the build ledger")
	}
	if err := ownDir(n.StateDir); err != nil {
		return "", fmt.Errorf("build ledger: %w", err)
	}
	return filepath.Join(n.StateDir, strconv.Itoa(vmid)+".json"), nil
}

// ownDir checks that only this process's user (root on a node) can
// change what dir holds: dir, when it exists, is a directory and no
// symlink, and it (or, while it does not exist, its nearest existing
// ancestor) and each directory above are owned by root or this user and
// writable by no one else, a directory above it sticky at most (/tmp). A
// ledger others can write would let them record any VM as a build's.
func ownDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%q: want an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symlink: name the directory itself", dir)
	} else if err == nil && !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	near := dir
	for {
		if _, err := os.Lstat(near); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		near = filepath.Dir(near)
	}
	resolved, err := filepath.EvalSymlinks(near)
	if err != nil {
		return err
	}
	me := uint32(os.Geteuid())
	for p := resolved; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner to check", p)
		}
		if st.Uid != 0 && st.Uid != me {
			return fmt.Errorf("%s (above or at %s) is owned by uid %d: want a directory only root writes", p, dir, st.Uid)
		}
		if fi.Mode().Perm()&0o022 != 0 && (p == resolved || fi.Mode()&os.ModeSticky == 0) {
			return fmt.Errorf("%s (above or at %s) is writable by others (mode %v): want a directory only root writes", p, dir, fi.Mode())
		}
		if p == "/" {
			return nil
		}
	}
}

// Record implements Host: the entry of vmid is written (one file a VM,
// atomically, root-only).
func (n NodeHost) Record(vmid int, r Record) error {
	p, err := n.recordPath(vmid)
	if err != nil {
		return err
	}
	return n.writeEntry(p, r)
}

// Recorded implements Host (ok false when vmid has no entry).
func (n NodeHost) Recorded(vmid int) (Record, bool, error) {
	p, err := n.recordPath(vmid)
	if err != nil {
		return Record{}, false, err
	}
	var r Record
	ok, err := readEntry(p, &r)
	return r, ok, err
}

// writeEntry writes v as the ledger's file p (atomically, root-only; the
// ledger's directories made when missing).
func (n NodeHost) writeEntry(p string, v any) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(n.StateDir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(p, b, 0o600)
}

// readEntry reads the ledger's file p into v (false when there is none).
func readEntry(p string, v any) (bool, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("build ledger %s: %w", p, err)
	}
	return true, nil
}

// Forget implements Host.
func (n NodeHost) Forget(vmid int) error {
	p, err := n.recordPath(vmid)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ImageRecord is the ledger's entry of an image a build unpacked from an
// archive and uploaded (Image.Unpack): the volume holds the file of
// digest Image, unpacked from the archive of digest Archive (both
// "ALG:HEX"). A later build reuses the volume only when its archive has
// that digest and the file on the node, hashed again, this one.
type ImageRecord struct {
	Volume  string `json:"volume"`
	Archive string `json:"archive"`
	Image   string `json:"image"`
}

// imageRecordPath is the entry of volid: images/<sha256 of volid>.json
// (a volume id holds ':' and '/').
func (n NodeHost) imageRecordPath(volid string) (string, error) {
	if n.StateDir == "" {
		return "", errors.New("no state directory for the build ledger")
	}
	if err := ownDir(n.StateDir); err != nil {
		return "", fmt.Errorf("build ledger: %w", err)
	}
	h := sha256.Sum256([]byte(volid))
	return filepath.Join(n.StateDir, "images", hex.EncodeToString(h[:])+".json"), nil
}

// RecordImage implements Host (one file an image, atomically, root-only).
func (n NodeHost) RecordImage(r ImageRecord) error {
	p, err := n.imageRecordPath(r.Volume)
	if err != nil {
		return err
	}
	return n.writeEntry(p, r)
}

// RecordedImage implements Host (ok false when volid has no entry, or one
// of another volume).
func (n NodeHost) RecordedImage(volid string) (ImageRecord, bool, error) {
	p, err := n.imageRecordPath(volid)
	if err != nil {
		return ImageRecord{}, false, err
	}
	var r ImageRecord
	ok, err := readEntry(p, &r)
	return r, ok && r.Volume == volid, err
}
