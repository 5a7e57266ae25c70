package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/firewall"
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

// markerRouteCause is recover's route cause: the cause persists while the
// lockdown marker is present and no interface carries a default route (the
// fail-closed condition of DESIGN.md section 4). The management interfaces
// come from the guard's own classification (firewall.Classify), the one
// source the daemon, the lockdown and the management-port rules use too.
func markerRouteCause(cfg config.Config) halt.CauseCheck {
	gc := daemon.GuardConfig(cfg.Guard)
	return routeCause{marker: cfg.Lockdown.Effective().Marker, management: func(ctx context.Context) ([]string, error) {
		c, err := firewall.Classify(ctx, gc)
		return c.Management, err
	}}.check
}

// routeCause checks the fail-closed condition; management lists the
// interfaces with a default route.
type routeCause struct {
	marker     string
	management func(context.Context) ([]string, error)
}

func (r routeCause) check(ctx context.Context, _ halt.State) error {
	if _, err := os.Stat(r.marker); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("lockdown marker %s: %w", r.marker, err)
	}
	m, err := r.management(ctx)
	if err != nil {
		return fmt.Errorf("management interfaces: %w", err)
	}
	if len(m) == 0 {
		return fmt.Errorf("lockdown marker %s present and no default route", r.marker)
	}
	return nil
}
