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
	return raiseDefault(cfg, ipv6DefaultSysctl, ipv6BackupFile, func(old string) string {
		return "1"
	})
}

const (
	conntrackAcctSysctl = "sys/net/netfilter/nf_conntrack_acct"
	conntrackAcctBackup = "guard-conntrack-acct.orig"
)

// enableConntrackAcct sets net.netfilter.nf_conntrack_acct=1 in the
// node's namespace so that conntrack counts the bytes and packets of
// each flow both ways: the egress record's kernel flows
// (egress.Flows) take them from conntrack's DESTROY events. It applies
// to flows begun after it is set. The previous value is saved once and
// put back by RemoveTable. Without conntrack loaded there is no such
// file: nothing to do (the guard's own ct rules load it).
func enableConntrackAcct(cfg Config) error {
	return raiseDefault(cfg, conntrackAcctSysctl, conntrackAcctBackup, func(string) string { return "1" })
}

// restoreConntrackAcct puts back the value saved by enableConntrackAcct.
func restoreConntrackAcct(cfg Config) error {
	return restoreDefault(cfg, conntrackAcctSysctl, conntrackAcctBackup)
}

// restoreIPv6Default puts back the value saved by disableIPv6Default.
func restoreIPv6Default(cfg Config) error {
	return restoreDefault(cfg, ipv6DefaultSysctl, ipv6BackupFile)
}

// raiseDefault sets the sysctl rel (under the proc root) to want(old)
// when that differs from old, after saving old once in the state
// directory as backup. A missing sysctl (a kernel without it) is nothing
// to do.
func raiseDefault(cfg Config, rel, backup string, want func(old string) string) error {
	p := filepath.Join(cfg.procRoot(), rel)
	old, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	saved := filepath.Join(cfg.stateDir(), backup)
	if _, err := os.Stat(saved); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(cfg.stateDir(), 0o755); err != nil {
			return fmt.Errorf("create state dir: %w", err)
		}
		if err := os.WriteFile(saved, old, 0o644); err != nil {
			return fmt.Errorf("save %s: %w", p, err)
		}
	}
	cur := strings.TrimSpace(string(old))
	if next := want(cur); next != cur {
		if err := os.WriteFile(p, []byte(next+"\n"), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}

// restoreDefault puts back the value raiseDefault saved as backup.
func restoreDefault(cfg Config, rel, backup string) error {
	saved := filepath.Join(cfg.stateDir(), backup)
	old, err := os.ReadFile(saved)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", saved, err)
	}
	p := filepath.Join(cfg.procRoot(), rel)
	if err := os.WriteFile(p, old, 0o644); err != nil {
		return fmt.Errorf("restore %s: %w", p, err)
	}
	if err := os.Remove(saved); err != nil {
		return fmt.Errorf("remove %s: %w", saved, err)
	}
	return nil
}

// checkPortSources turns on the loose source check (rp_filter 2) of each
// port in ports (guest ports) that has it off (review 6). A frame to a
// reserved link-local group (01:80:c2:00:00:0X) that the bridge does not
// forward skips the bridge's prerouting hook, and the node's stack
// receives it on the port device itself (net/bridge/br_input.c
// br_handle_frame, RX_HANDLER_PASS; from memory): an ARP request there,
// for an address of the node, with a forged sender, made the node create a
// neighbour entry per sender (net/ipv4/arp.c arp_process) past every
// layer-2 check. A port has no address, so with rp_filter 1 or 2 every
// sender fails the source check (net/ipv4/fib_frontend.c
// __fib_validate_source: no_addr, last_resort, e_rpf) and nothing is
// created or answered. The effective value is the larger of the port's and
// "all", so a node's own choice of 1 stays. Only guest ports change: the
// default that new interfaces inherit stays as the node has it (EVPN exit
// nodes want 0 on theirs), so the guard sets each port as it appears.
func checkPortSources(cfg Config, ports []string) error {
	for _, port := range ports {
		if !portNameRE.MatchString(port) || port == "." || port == ".." {
			continue
		}
		p := filepath.Join(cfg.procRoot(), "sys/net/ipv4/conf", port, "rp_filter")
		v, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // the port went meanwhile
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if strings.TrimSpace(string(v)) != "0" {
			continue
		}
		if err := os.WriteFile(p, []byte("2\n"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}
