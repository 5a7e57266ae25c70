package lockdown

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// State is what the controller published after its last reconcile. It is
// written as JSON to the state file for "pve-inspectd lockdown status".
type State struct {
	// Marker: the marker file is present (or could not be checked).
	Marker bool `json:"marker"`
	// Enforced: the lockdown is proven in force (only with Marker).
	Enforced bool `json:"enforced"`
	// Converged: the node is in the state the marker asks for (lockdown
	// enforced, or lifted with the resolver file restored).
	Converged bool `json:"converged"`
	// Reason says what stands in the way when not Converged.
	Reason string `json:"reason,omitempty"`
	// Warnings are problems that do not stop convergence.
	Warnings []string `json:"warnings,omitempty"`
	// FailClosed: the blanket forward drop is (or may still be) on.
	FailClosed bool `json:"fail_closed"`
	// ResolverBlanked: the resolver file holds our comment line.
	ResolverBlanked bool `json:"resolver_blanked"`
	// Management lists the interfaces that carry a default route.
	Management []string `json:"management"`
	// Halted is the reason of the last halt this daemon asked for.
	Halted string `json:"halted,omitempty"`
	// LastAssert is the end of the last reconcile that converged.
	LastAssert time.Time `json:"last_assert"`
	// LastLatencySeconds is the last marker-to-enforced latency.
	LastLatencySeconds float64 `json:"last_latency_seconds,omitempty"`
	// Updated is when this state was published.
	Updated time.Time `json:"updated"`
	// PID is the publishing daemon's process id.
	PID int `json:"pid"`
}

// maxStateSize bounds the state file a reader accepts.
const maxStateSize = 64 << 10

// WriteState writes s to path atomically (atomicfile),
// creating the directory (0755) when missing.
func WriteState(path string, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	b = append(b, '\n')
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

// ErrNoState means no daemon has published a state file at that path.
var ErrNoState = errors.New("no lockdown state published (is pve-inspectd running?)")

// ReadState reads a state file written by [WriteState].
func ReadState(path string) (State, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return State{}, ErrNoState
		}
		return State{}, fmt.Errorf("read state: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateSize+1))
	if err != nil {
		return State{}, fmt.Errorf("read state: %w", err)
	}
	return ParseState(b)
}

// ParseState decodes a state document strictly (unknown fields, trailing
// data and oversized input are errors).
func ParseState(b []byte) (State, error) {
	if len(b) > maxStateSize {
		return State{}, fmt.Errorf("parse state: larger than %d bytes", maxStateSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s State
	if err := dec.Decode(&s); err != nil {
		return State{}, fmt.Errorf("parse state: %w", err)
	}
	if dec.More() {
		return State{}, errors.New("parse state: trailing data")
	}
	if s.PID < 0 {
		return State{}, fmt.Errorf("parse state: bad pid %d", s.PID)
	}
	return s, nil
}

// InForce reports whether the node is in the state the marker asks for,
// according to the state the running daemon published in stateFile: nil
// when the marker is absent, or present and a fresh state (updated within
// maxAge of now, by a process that is alive) says the lockdown is enforced;
// otherwise an error saying what stands in the way. It is the cause check
// for lifting a halt: a lockdown that cannot be proven in force keeps the
// node halted.
func InForce(marker, stateFile string, maxAge time.Duration, now time.Time) error {
	present, err := MarkerPresent(marker)
	if err != nil {
		return err
	}
	if !present {
		return nil
	}
	st, err := ReadState(stateFile)
	if err != nil {
		return fmt.Errorf("lockdown marker %s present, lockdown not proven: %w", marker, err)
	}
	switch {
	case !processAlive(st.PID):
		return fmt.Errorf("lockdown marker %s present and the daemon that published %s (pid %d) is not running", marker, stateFile, st.PID)
	case now.Sub(st.Updated) > maxAge:
		return fmt.Errorf("lockdown marker %s present and the daemon's state is stale (updated %s)", marker, st.Updated.Format(time.RFC3339))
	case !st.Marker:
		return fmt.Errorf("lockdown marker %s present and the daemon has not acted on it yet", marker)
	case !st.Enforced:
		return fmt.Errorf("lockdown marker %s present and the lockdown is not in force: %s", marker, st.Reason)
	}
	return nil
}

// processAlive reports whether pid names a running process.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
