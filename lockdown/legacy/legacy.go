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
	// Mask masks the unit persistently (a link to /dev/null in
	// /etc/systemd/system) and reloads systemd.
	Mask(ctx context.Context, unit string) error
	// Masked reports whether the unit is masked.
	Masked(ctx context.Context, unit string) (bool, error)
	// Reload makes systemd read the unit files again.
	Reload(ctx context.Context) error
}

// OwnUnit is the reference lockdown unit's name, which the pve-inspectd
// package ships itself (it asks the daemon for the lockdown, so the
// reference runbook keeps working): the takeover moves the reference's
// file of that name aside instead of masking the name.
const OwnUnit = "inspect-proxmox-egress-lockdown.service"

// Where the reference scripts put their unit files and their lockdown
// script (host paths under Takeover.Root).
const (
	unitDir         = "etc/systemd/system"
	referenceScript = "usr/local/bin/inspect-proxmox-egress-lockdown.sh"
	asideSuffix     = ".disabled-by-pve-inspectd"
)

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
	UnitsDisabled []string
	// UnitsMasked can no longer be started by anyone; UnitFilesMoved are
	// the reference's unit files renamed with a suffix systemd ignores.
	UnitsMasked    []string
	UnitFilesMoved []string
	// ScriptDisabled: the reference lockdown script lost its execute bits.
	ScriptDisabled  bool
	RulesRemoved    []string
	ResolverRestore bool
}

// Run performs the takeover. It is safe to run again: a second run finds
// nothing to do.
func (t *Takeover) Run(ctx context.Context) (Report, error) {
	var rep Report
	if err := t.takeUnits(ctx, &rep); err != nil {
		return rep, err
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

// takeUnits stops and disables the reference's units, moves their unit
// files out of systemd's way and masks every name but OwnUnit (ours now),
// so neither a timer, an OnFailure= nor an operator can start the old
// script again; the script itself loses its execute bits.
func (t *Takeover) takeUnits(ctx context.Context, rep *Report) error {
	root := t.Root
	if root == "" {
		root = "/"
	}
	for _, u := range Units {
		if masked, err := t.Systemd.Masked(ctx, u); err != nil {
			return fmt.Errorf("look up %s: %w", u, err)
		} else if masked {
			continue // taken over by an earlier run
		}
		file := filepath.Join(root, unitDir, u)
		_, serr := os.Lstat(file)
		theirs := serr == nil
		ok, err := t.Systemd.UnitExists(ctx, u)
		if err != nil {
			return fmt.Errorf("look up %s: %w", u, err)
		}
		if u == OwnUnit && !theirs {
			continue // only ours (or none) is there
		}
		if ok {
			if err := t.Systemd.StopAndDisable(ctx, u); err != nil {
				return fmt.Errorf("disable %s: %w", u, err)
			}
			rep.UnitsDisabled = append(rep.UnitsDisabled, u)
		}
		if theirs {
			if err := os.Rename(file, file+asideSuffix); err != nil {
				return fmt.Errorf("move %s aside: %w", file, err)
			}
			rep.UnitFilesMoved = append(rep.UnitFilesMoved, file+asideSuffix)
		}
		if u == OwnUnit || (!ok && !theirs) {
			continue
		}
		if err := t.Systemd.Mask(ctx, u); err != nil {
			return fmt.Errorf("mask %s: %w", u, err)
		}
		rep.UnitsMasked = append(rep.UnitsMasked, u)
	}
	if len(rep.UnitFilesMoved) > 0 {
		if err := t.Systemd.Reload(ctx); err != nil {
			return fmt.Errorf("reload systemd: %w", err)
		}
	}
	script := filepath.Join(root, referenceScript)
	if fi, err := os.Stat(script); err == nil && fi.Mode().Perm()&0o111 != 0 {
		if err := os.Chmod(script, fi.Mode().Perm()&^0o111); err != nil {
			return fmt.Errorf("disable %s: %w", script, err)
		}
		rep.ScriptDisabled = true
	}
	return nil
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
