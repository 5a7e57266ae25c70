package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
)

// HaltSection configures the fail-deadly halt ([halt]). Empty values mean
// the defaults of package lockdown/halt.
type HaltSection struct {
	// Units are stopped and runtime-masked by a halt; default
	// ["pveproxy.service", "pvedaemon.service"].
	Units []string `toml:"units"`
	// StateFile records an active halt; default /run/pve-inspectd/halted.
	StateFile string `toml:"state_file"`
	// Transport is how the halt reaches systemd: "private" (the socket
	// /run/systemd/private), "system" (the system bus) or "auto" (private,
	// then the system bus); default "auto".
	Transport string `toml:"transport"`
}

var unitNameRE = regexp.MustCompile(`^[A-Za-z0-9:_.@\\-]+\.[a-z]+$`)

func (s HaltSection) validate(prefix string) error {
	if s.Units != nil && len(s.Units) == 0 {
		return &KeyError{Key: prefix + ".units", Err: errors.New("must name at least one unit")}
	}
	for _, u := range s.Units {
		if !unitNameRE.MatchString(u) || len(u) > 255 || u[0] == '.' {
			return &KeyError{Key: prefix + ".units", Err: fmt.Errorf("%q is not a unit name (want e.g. pveproxy.service)", u)}
		}
	}
	if s.StateFile != "" && (!filepath.IsAbs(s.StateFile) || filepath.Clean(s.StateFile) != s.StateFile) {
		return &KeyError{Key: prefix + ".state_file", Err: fmt.Errorf("%q is not a clean absolute path", s.StateFile)}
	}
	switch s.Transport {
	case "", "private", "system", "auto":
	default:
		return &KeyError{Key: prefix + ".transport", Err: fmt.Errorf("%q: want private, system or auto", s.Transport)}
	}
	return nil
}
