package legacy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Units are the reference scripts' systemd units, timer first so that it
// cannot start the service again while we stop it.
var Units = []string{
	"inspect-proxmox-egress-lockdown.timer",
	"inspect-proxmox-egress-lockdown.service",
	"inspect-proxmox-block-cloud-metadata.service",
	"inspect-proxmox-egress-lockdown-halt.service",
}

// lockdownComment prefixes the comment of every reference lockdown rule.
const lockdownComment = "inspect-proxmox-egress-lockdown"

// Resolver files of the reference lockdown.
const (
	resolvPath   = "run/dnsmasq/resolv.conf"
	resolvBackup = "run/dnsmasq/resolv.conf.inspect-egress-backup"
)

// Systemd is what the takeover needs from systemd.
type Systemd interface {
	// UnitExists reports whether systemd knows the unit (loaded or as a file).
	UnitExists(ctx context.Context, unit string) (bool, error)
	// StopAndDisable stops the unit and disables its unit file.
	StopAndDisable(ctx context.Context, unit string) error
}

// Runner runs a command and returns its standard output.
type Runner func(ctx context.Context, argv ...string) ([]byte, error)

// ExecRunner runs commands on this machine.
func ExecRunner(ctx context.Context, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return out, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return out, nil
}

// Takeover removes the reference scripts from a node.
type Takeover struct {
	Systemd Systemd
	Exec    Runner
	// Root is prepended to host paths ("/" on a node).
	Root string
	// Marker is the lockdown marker (default
	// /etc/inspect-proxmox-egress-lockdown); LockdownRecord is pve-inspectd's
	// own resolver backup record (default
	// /run/pve-inspectd/lockdown-resolv.json). Both are host paths.
	Marker, LockdownRecord string
}

// Report says what a takeover did.
type Report struct {
	UnitsDisabled   []string
	RulesRemoved    []string
	ResolverRestore bool
}

// Run performs the takeover. It is safe to run again: a second run finds
// nothing to do.
func (t *Takeover) Run(ctx context.Context) (Report, error) {
	var rep Report
	for _, u := range Units {
		ok, err := t.Systemd.UnitExists(ctx, u)
		if err != nil {
			return rep, fmt.Errorf("look up %s: %w", u, err)
		}
		if !ok {
			continue
		}
		if err := t.Systemd.StopAndDisable(ctx, u); err != nil {
			return rep, fmt.Errorf("disable %s: %w", u, err)
		}
		rep.UnitsDisabled = append(rep.UnitsDisabled, u)
	}
	removed, err := t.removeRules(ctx)
	rep.RulesRemoved = removed
	if err != nil {
		return rep, err
	}
	// The reference lockdown kept the original resolver next to the
	// blanked one; put it back so that our lockdown backs up the real
	// content, not a blanked file.
	root := t.Root
	if root == "" {
		root = "/"
	}
	backup := filepath.Join(root, resolvBackup)
	if _, err := os.Stat(backup); errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	} else if err != nil {
		return rep, fmt.Errorf("resolver backup: %w", err)
	}
	marker, record := t.Marker, t.LockdownRecord
	if marker == "" {
		marker = "/etc/inspect-proxmox-egress-lockdown"
	}
	if record == "" {
		record = "/run/pve-inspectd/lockdown-resolv.json"
	}
	if _, err := os.Stat(filepath.Join(root, marker)); err == nil {
		// The lockdown stays asked for: the resolver stays blank. Our
		// lockdown took the reference's original as its own backup when it
		// started (lockdown.ReferenceBackupSuffix); once it has, theirs goes.
		if _, err := os.Stat(filepath.Join(root, record)); err == nil {
			if err := os.Remove(backup); err != nil {
				return rep, fmt.Errorf("remove adopted resolver backup: %w", err)
			}
		}
		return rep, nil
	}
	if err := os.Rename(backup, filepath.Join(root, resolvPath)); err != nil {
		return rep, fmt.Errorf("restore resolver backup: %w", err)
	}
	rep.ResolverRestore = true
	return rep, nil
}

// reference rules matched by specification (no comment on them).
var exactRules = []struct{ tool, table, rule string }{
	{"iptables", "raw", "-A PREROUTING -d 169.254.0.0/16 -j DROP"},
	{"iptables", "filter", "-A FORWARD -s 169.254.0.0/16 -j DROP"},
	{"ip6tables", "filter", "-A FORWARD -j DROP"},
}

func (t *Takeover) removeRules(ctx context.Context) ([]string, error) {
	var removed []string
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool + "-save"); err != nil {
			continue // no xtables tools, so no reference rules
		}
		for _, table := range []string{"raw", "mangle", "filter"} {
			out, err := t.Exec(ctx, tool+"-save", "-t", table)
			if err != nil {
				// A table the kernel does not have holds no rules.
				continue
			}
			for _, rule := range ReferenceRules(string(out), tool, table) {
				args, err := SplitRule(rule)
				if err != nil {
					return removed, fmt.Errorf("parse %s rule %q: %w", tool, rule, err)
				}
				args[0] = "-D"
				if _, err := t.Exec(ctx, append([]string{tool, "-w", "-t", table}, args...)...); err != nil {
					return removed, fmt.Errorf("remove %s rule: %w", tool, err)
				}
				removed = append(removed, tool+" -t "+table+" "+rule)
			}
		}
	}
	return removed, nil
}

// ReferenceRules picks the reference scripts' rules out of the output of
// `<tool>-save -t <table>`.
func ReferenceRules(save, tool, table string) []string {
	var out []string
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		if strings.Contains(line, `--comment "`+lockdownComment+" ") || strings.Contains(line, "--comment "+lockdownComment+" ") {
			out = append(out, line)
			continue
		}
		for _, r := range exactRules {
			if r.tool == tool && r.table == table && line == r.rule {
				out = append(out, line)
			}
		}
	}
	return out
}

// SplitRule splits one iptables-save rule line into arguments, honouring
// the double quotes and backslash escapes iptables-save writes.
func SplitRule(line string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			have = true
		case c == '"':
			inQuote = !inQuote
			have = true
		case (c == ' ' || c == '\t') && !inQuote:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if have {
		args = append(args, cur.String())
	}
	if len(args) < 2 || args[0] != "-A" {
		return nil, errors.New("not an -A rule")
	}
	return args, nil
}
