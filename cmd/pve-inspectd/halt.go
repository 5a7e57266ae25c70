package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
)

// haltConfig maps the [halt] section onto the halt package's configuration.
func haltConfig(s config.HaltSection) halt.Config { return daemon.HaltConfig(s) }

// newHaltCmd is `pve-inspectd halt --reason TEXT`: the fail-deadly halt on
// demand, run by the OnFailure= unit when the daemon keeps failing while
// the lockdown marker is present. A configuration that cannot be read does
// not stop it: it halts with the defaults and then reports the error.
func newHaltCmd(g *globals) *cobra.Command {
	var reason string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "halt --reason TEXT",
		Short: "stop and runtime-mask the Proxmox API daemons (fail-deadly halt)",
		Long: "Stops and runtime-masks the configured units (default pveproxy.service and\n" +
			"pvedaemon.service) over systemd's D-Bus API and records the reason in the\n" +
			"state file (default /run/pve-inspectd/halted) and the journal. Idempotent.\n" +
			"`pve-inspectd recover` lifts the halt; so does a reboot.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkReason(reason); err != nil {
				return &exitError{code: 2, msg: err.Error()}
			}
			log := g.logger()
			cfg, cerr := g.loadConfig()
			if cerr != nil {
				log.Error("configuration unreadable: halting with the default units and state file", "component", "halt", "error", cerr)
				cfg = config.Default()
			}
			h, err := halt.New(haltConfig(cfg.Halt), log, nil)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if err := h.Halt(ctx, reason); err != nil {
				return errors.Join(err, cerr)
			}
			return cerr
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the halt happens (recorded in the state file, journal and metrics)")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up on systemd after this long")
	_ = cmd.MarkFlagRequired("reason")
	return cmd
}

// checkReason rejects reasons the halt would have to rewrite.
func checkReason(r string) error {
	switch {
	case strings.TrimSpace(r) == "":
		return errors.New("--reason must not be empty")
	case len(r) > 200:
		return fmt.Errorf("--reason is %d bytes long, at most 200 allowed", len(r))
	case strings.IndexFunc(r, unicode.IsControl) >= 0:
		return errors.New("--reason must not contain control characters")
	}
	return nil
}

// causeCheckFor builds the cause check recover uses from the configuration.
type causeCheckFor func(cfg config.Config) halt.CauseCheck

// newRecoverCmd is `pve-inspectd recover`: it lifts a halt unless cause
// (built from the configuration) says the cause persists. The wiring in
// root.go decides the check; see lockdownCause.
func newRecoverCmd(g *globals, cause causeCheckFor) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "lift a fail-deadly halt once its cause is gone",
		Long: "Refuses (exit 3) while the cause of the halt persists. Otherwise unmasks and\n" +
			"starts the halted units and removes the state file. Without a recorded halt\n" +
			"it does nothing.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			h, err := halt.New(haltConfig(cfg.Halt), g.logger(), nil)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			err = h.Recover(ctx, cause(cfg))
			var ce *halt.CauseError
			switch {
			case errors.Is(err, halt.ErrNotHalted):
				_, werr := fmt.Fprintln(cmd.OutOrStdout(), "not halted: nothing to recover")
				return werr
			case errors.As(err, &ce):
				return &exitError{code: 3, msg: err.Error()}
			case err != nil:
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "recovered: units unmasked and started")
			return err
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up on systemd after this long")
	return cmd
}

// DefaultMarker is the lockdown marker of DESIGN.md section 4.
const DefaultMarker = "/etc/inspect-proxmox-egress-lockdown"

// markerRouteCause is recover's cause check for now: the cause persists
// while the lockdown marker is present and no interface has a default route
// (the fail-closed condition of DESIGN.md section 4), whatever the recorded
// reason says. The lockdown controller will supply a check that proves its
// lockdown in force (it knows the other causes: a refused commit, an
// unverifiable table, failed DNS blanking); wire it here when it lands.
func markerRouteCause(cfg config.Config) halt.CauseCheck {
	return routeCause{marker: cfg.Lockdown.Effective().Marker, procNet: "/proc/net"}.check
}

// routeCause checks the fail-closed condition under configurable paths.
type routeCause struct {
	marker  string
	procNet string
}

func (r routeCause) check(_ context.Context, _ halt.State) error {
	if _, err := os.Stat(r.marker); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("lockdown marker %s: %w", r.marker, err)
	}
	ok, err := hasDefaultRoute(r.procNet)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("lockdown marker %s present and no default route", r.marker)
	}
	return nil
}

// hasDefaultRoute reports whether /proc/net/route or /proc/net/ipv6_route
// (under procNet) holds a usable default route on an interface other than
// lo.
func hasDefaultRoute(procNet string) (bool, error) {
	v4, err := os.Open(filepath.Join(procNet, "route"))
	if err != nil {
		return false, fmt.Errorf("read routes: %w", err)
	}
	defer v4.Close()
	if ok, err := defaultRoute4(v4); ok || err != nil {
		return ok, err
	}
	v6, err := os.Open(filepath.Join(procNet, "ipv6_route"))
	if errors.Is(err, os.ErrNotExist) { // IPv6 disabled
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("read routes: %w", err)
	}
	defer v6.Close()
	return defaultRoute6(v6)
}

const (
	rtfUp     = 0x0001
	rtfReject = 0x0200
)

// defaultRoute4 parses /proc/net/route: Iface Destination Gateway Flags
// RefCnt Use Metric Mask ...
func defaultRoute4(r io.Reader) (bool, error) {
	sc := bufio.NewScanner(r)
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first || len(f) < 8 {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err != nil {
			return false, fmt.Errorf("parse /proc/net/route flags %q: %w", f[3], err)
		}
		if f[0] != "lo" && f[1] == "00000000" && f[7] == "00000000" && flags&rtfUp != 0 && flags&rtfReject == 0 {
			return true, nil
		}
	}
	return false, sc.Err()
}

// defaultRoute6 parses /proc/net/ipv6_route: dst dst_len src src_len
// next_hop metric refcnt use flags iface.
func defaultRoute6(r io.Reader) (bool, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		flags, err := strconv.ParseUint(f[8], 16, 32)
		if err != nil {
			return false, fmt.Errorf("parse /proc/net/ipv6_route flags %q: %w", f[8], err)
		}
		if f[9] != "lo" && f[0] == strings.Repeat("0", 32) && f[1] == "00" && flags&rtfUp != 0 && flags&rtfReject == 0 {
			return true, nil
		}
	}
	return false, sc.Err()
}
