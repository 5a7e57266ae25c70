package provision

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"
)

// Paths the engine keeps its state in (host paths, under the Root).
const (
	StatePath    = "/var/lib/pve-bootstrap/state.json"
	applyLock    = "/var/lib/pve-bootstrap/apply.lock"
	BootIDPath   = "/proc/sys/kernel/random/boot_id"
	ResumeUnit   = "pve-bootstrap-resume.service"
	ResumeUnitAt = "/etc/systemd/system/" + ResumeUnit
	dpkgLockPath = "/var/lib/dpkg/lock-frontend"
	dpkgDBLock   = "/var/lib/dpkg/lock"
	instanceID   = "/var/lib/cloud/data/instance-id"
	machineID    = "/etc/machine-id"
)

// Step states recorded in state.json.
const (
	StatusPending = "pending"
	StatusDone    = "done"
	StatusFailed  = "failed"
)

// StepState is one step's recorded progress.
type StepState struct {
	Status string    `json:"status"`
	At     time.Time `json:"at"`
	BootID string    `json:"boot_id"`
	// Applied is true when this run changed something (false: the check
	// found it done).
	Applied bool   `json:"applied"`
	Output  string `json:"output,omitempty"`
}

// RebootState records a reboot the engine asked for.
type RebootState struct {
	AfterStep string    `json:"after_step"`
	BootID    string    `json:"boot_id"`
	At        time.Time `json:"at"`
}

// State is the content of state.json.
type State struct {
	Version int                  `json:"version"`
	BootID  string               `json:"boot_id"`
	Steps   map[string]StepState `json:"steps"`
	Reboot  *RebootState         `json:"reboot,omitempty"`
	// SecretsInstance is the instance id the per-instance secrets were
	// made for.
	SecretsInstance string `json:"secrets_instance,omitempty"`
	// InspectdSHA256 is the digest of the installed pve-inspectd .deb.
	InspectdSHA256 string    `json:"inspectd_sha256,omitempty"`
	Completed      time.Time `json:"completed,omitzero"`
}

// LoadState reads state.json; a missing file is an empty state.
func LoadState(root Root) (*State, error) {
	b, err := root.ReadFile(StatePath)
	if errors.Is(err, fs.ErrNotExist) {
		return &State{Version: 1, Steps: map[string]StepState{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse state %s: %w", StatePath, err)
	}
	if s.Version != 1 {
		return nil, fmt.Errorf("parse state %s: unsupported version %d", StatePath, s.Version)
	}
	if s.Steps == nil {
		s.Steps = map[string]StepState{}
	}
	return &s, nil
}

// Save writes state.json atomically.
func (s *State) Save(root Root) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	return root.WriteFile(StatePath, append(b, '\n'), 0o600)
}

// BootID reads the kernel's boot id.
func BootID(root Root) (string, error) {
	b, err := root.ReadFile(BootIDPath)
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read boot id: %s is empty", BootIDPath)
	}
	return id, nil
}

// InstanceID is the id per-instance secrets are bound to: cloud-init's
// instance id, else the machine id.
func InstanceID(root Root) (string, error) {
	for _, p := range []string{instanceID, machineID} {
		b, err := root.ReadFile(p)
		if err == nil {
			if id := strings.TrimSpace(string(b)); id != "" {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("instance id: neither %s nor %s holds one", instanceID, machineID)
}
