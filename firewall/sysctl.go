package firewall

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/nsrun"
)

// inNS runs fn inside ns (nil: here). /proc/sys/net shows the network
// namespace of the thread that opens it, so a guard working on another
// namespace must touch its sysctls from inside it.
func inNS(ns *netns.NsHandle, fn func() error) error { return nsrun.Do(ns, fn) }

const (
	ipv6DefaultSysctl = "sys/net/ipv6/conf/default/disable_ipv6"
	ipv6BackupFile    = "guard-ipv6-default-disable.orig"
)

// disableIPv6Default sets net.ipv6.conf.default.disable_ipv6=1 so that new
// vnets come up without IPv6. The previous value is saved once in the state
// directory so that RemoveTable can restore it. A kernel without IPv6 has
// no such file: nothing to do.
func disableIPv6Default(cfg Config) error {
	p := filepath.Join(cfg.procRoot(), ipv6DefaultSysctl)
	old, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	backup := filepath.Join(cfg.stateDir(), ipv6BackupFile)
	if _, err := os.Stat(backup); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(cfg.stateDir(), 0o755); err != nil {
			return fmt.Errorf("create state dir: %w", err)
		}
		if err := os.WriteFile(backup, old, 0o644); err != nil {
			return fmt.Errorf("save %s: %w", p, err)
		}
	}
	if strings.TrimSpace(string(old)) == "1" {
		return nil
	}
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// restoreIPv6Default puts back the value saved by disableIPv6Default.
func restoreIPv6Default(cfg Config) error {
	backup := filepath.Join(cfg.stateDir(), ipv6BackupFile)
	old, err := os.ReadFile(backup)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", backup, err)
	}
	p := filepath.Join(cfg.procRoot(), ipv6DefaultSysctl)
	if err := os.WriteFile(p, old, 0o644); err != nil {
		return fmt.Errorf("restore %s: %w", p, err)
	}
	if err := os.Remove(backup); err != nil {
		return fmt.Errorf("remove %s: %w", backup, err)
	}
	return nil
}
