package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/containment"
	"github.com/pve-inspect/pve-inspect/sandboxapi/containment/probe"
)

// CheckSection configures the containment check (`pve-inspectd check` and
// the API's check endpoint).
type CheckSection struct {
	// ProbePath is the static probe binary uploaded into guests.
	ProbePath string `toml:"probe_path"`
	// GuestDir is the guest directory the probe is uploaded to.
	GuestDir string `toml:"guest_dir"`
	// Timeout bounds each probe target.
	Timeout time.Duration `toml:"timeout"`
	// Concurrency bounds parallel probes inside the guest.
	Concurrency int `toml:"concurrency"`
}

// defaultCheck is the check section's defaults.
func defaultCheck() CheckSection {
	return CheckSection{
		ProbePath:   containment.DefaultProbePath,
		GuestDir:    "/tmp",
		Timeout:     3 * time.Second,
		Concurrency: 16,
	}
}

func (s CheckSection) validate(prefix string) error {
	switch {
	case !filepath.IsAbs(s.ProbePath):
		return &KeyError{Key: prefix + ".probe_path", Err: fmt.Errorf("%q: want an absolute path", s.ProbePath)}
	case !filepath.IsAbs(s.GuestDir):
		return &KeyError{Key: prefix + ".guest_dir", Err: fmt.Errorf("%q: want an absolute path", s.GuestDir)}
	case s.Timeout <= 0 || s.Timeout > probe.MaxTimeoutMS*time.Millisecond:
		return &KeyError{Key: prefix + ".timeout", Err: fmt.Errorf("%v: want more than 0 and at most %v", s.Timeout, probe.MaxTimeoutMS*time.Millisecond)}
	case s.Concurrency < 1 || s.Concurrency > 64:
		return &KeyError{Key: prefix + ".concurrency", Err: errors.New("want 1..64")}
	}
	return nil
}
