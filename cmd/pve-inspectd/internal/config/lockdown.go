package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// LockdownSection is [lockdown]: the marker-gated egress lockdown (package
// lockdown). Every key is optional; Effective fills the defaults.
type LockdownSection struct {
	// Marker is the file whose presence asks for the lockdown.
	Marker string `toml:"marker"`
	// Resolver is the resolver file the SDN dnsmasq instances forward
	// through; it is blanked while the lockdown is on.
	Resolver string `toml:"resolver"`
	// BackupDir holds the resolver backup while the lockdown is on.
	BackupDir string `toml:"backup_dir"`
	// StateFile is where the daemon publishes the lockdown state for
	// "pve-inspectd lockdown status".
	StateFile string `toml:"state_file"`
	// ReassertInterval is the period of the re-assert backstop ("10s").
	ReassertInterval time.Duration `toml:"reassert_interval"`
	// Dnsmasq selects the processes that get SIGHUP.
	Dnsmasq DnsmasqMatchSection `toml:"dnsmasq"`
}

// DnsmasqMatchSection is [lockdown.dnsmasq]: a process is signalled only
// when its executable's base name is Exe and one of its command-line
// arguments contains one of CmdlineContains.
type DnsmasqMatchSection struct {
	// Exe is the executable's base name.
	Exe string `toml:"exe"`
	// CmdlineContains lists substrings; empty means "/etc/dnsmasq.d/" and
	// the resolver path.
	CmdlineContains []string `toml:"cmdline_contains"`
}

// Lockdown defaults.
const (
	DefaultLockdownMarker    = "/etc/inspect-proxmox-egress-lockdown"
	DefaultLockdownResolver  = "/run/dnsmasq/resolv.conf"
	DefaultLockdownBackupDir = "/run/pve-inspectd"
	DefaultLockdownStateFile = "/run/pve-inspectd/lockdown.json"
	DefaultLockdownReassert  = 10 * time.Second
)

// Effective returns the section with every unset key at its default.
func (s LockdownSection) Effective() LockdownSection {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&s.Marker, DefaultLockdownMarker)
	def(&s.Resolver, DefaultLockdownResolver)
	def(&s.BackupDir, DefaultLockdownBackupDir)
	def(&s.StateFile, DefaultLockdownStateFile)
	def(&s.Dnsmasq.Exe, "dnsmasq")
	if s.ReassertInterval == 0 {
		s.ReassertInterval = DefaultLockdownReassert
	}
	if len(s.Dnsmasq.CmdlineContains) == 0 {
		s.Dnsmasq.CmdlineContains = []string{"/etc/dnsmasq.d/", s.Resolver}
	}
	return s
}

func (s LockdownSection) validate(prefix string) error {
	e := s.Effective()
	for _, k := range []struct{ key, v string }{
		{"marker", e.Marker}, {"resolver", e.Resolver}, {"backup_dir", e.BackupDir}, {"state_file", e.StateFile},
	} {
		if !filepath.IsAbs(k.v) || filepath.Clean(k.v) == "/" {
			return &KeyError{Key: prefix + "." + k.key, Err: fmt.Errorf("%q is not an absolute file path", k.v)}
		}
	}
	if filepath.Clean(e.Marker) == filepath.Clean(e.Resolver) {
		return &KeyError{Key: prefix + ".resolver", Err: errors.New("must not be the marker file")}
	}
	if e.ReassertInterval < time.Second || e.ReassertInterval > time.Hour {
		return &KeyError{Key: prefix + ".reassert_interval", Err: fmt.Errorf("%v is outside 1s..1h", e.ReassertInterval)}
	}
	if strings.ContainsRune(e.Dnsmasq.Exe, '/') {
		return &KeyError{Key: prefix + ".dnsmasq.exe", Err: fmt.Errorf("%q must be a base name, not a path", e.Dnsmasq.Exe)}
	}
	for i, c := range e.Dnsmasq.CmdlineContains {
		if strings.TrimSpace(c) == "" {
			return &KeyError{Key: fmt.Sprintf("%s.dnsmasq.cmdline_contains[%d]", prefix, i), Err: errors.New("must not be empty (it would match every dnsmasq)")}
		}
	}
	return nil
}
