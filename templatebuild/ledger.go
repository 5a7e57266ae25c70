package templatebuild

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

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
}

// DefaultStateDir is where `template build` keeps its ledger.
const DefaultStateDir = "/var/lib/pve-inspectd/template-builds"

func (n NodeHost) recordPath(vmid int) (string, error) {
	if n.StateDir == "" {
		return "", errors.New("no state directory for the build ledger")
	}
	return filepath.Join(n.StateDir, strconv.Itoa(vmid)+".json"), nil
}

// Record implements Host: the entry of vmid is written (one file a VM,
// atomically, root-only).
func (n NodeHost) Record(vmid int, r Record) error {
	p, err := n.recordPath(vmid)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.StateDir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(n.StateDir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(p, b, 0o600)
}

// Recorded implements Host (ok false when vmid has no entry).
func (n NodeHost) Recorded(vmid int) (Record, bool, error) {
	p, err := n.recordPath(vmid)
	if err != nil {
		return Record{}, false, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, false, fmt.Errorf("build ledger %s: %w", p, err)
	}
	return r, true, nil
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
