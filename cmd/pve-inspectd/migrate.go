package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/lockdown/legacy"
)

// newMigrateCmd takes the node over from the reference provisioning
// scripts; the package's postinst runs it.
func newMigrateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate-reference",
		Short: "stop and mask the reference scripts' units, remove their iptables rules (keeps the lockdown marker)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			out := cmd.OutOrStdout()
			var sd legacy.Systemd
			if _, err := os.Stat("/run/systemd/system"); err != nil {
				// Installed into a system that is not running (a chroot, an
				// image build): no unit to stop; the next boot has none of
				// ours competing only if the operator disables them.
				fmt.Fprintln(out, "systemd is not running: reference units left as they are")
				sd = noSystemd{}
			} else {
				d, err := legacy.NewDBusSystemd(ctx)
				if err != nil {
					return fmt.Errorf("migrate-reference: %w", err)
				}
				defer d.Close()
				sd = d
			}
			cfg, err := g.loadConfig()
			if err != nil {
				return fmt.Errorf("migrate-reference: %w", err)
			}
			lk := cfg.Lockdown.Effective()
			rep, err := (&legacy.Takeover{Systemd: sd, Exec: legacy.ExecRunner, Root: "/",
				Marker: lk.Marker, LockdownRecord: lockdown.BackupRecordPath(lk.BackupDir)}).Run(ctx)
			for _, u := range rep.UnitsDisabled {
				fmt.Fprintf(out, "disabled reference unit %s\n", u)
			}
			for _, f := range rep.UnitFilesMoved {
				fmt.Fprintf(out, "moved the reference unit file out of systemd's way: %s\n", f)
			}
			for _, u := range rep.UnitsMasked {
				fmt.Fprintf(out, "masked reference unit %s\n", u)
			}
			if rep.ScriptDisabled {
				fmt.Fprintln(out, "reference lockdown script no longer executable")
			}
			for _, r := range rep.RulesRemoved {
				fmt.Fprintf(out, "removed reference rule: %s\n", r)
			}
			if rep.ResolverRestore {
				fmt.Fprintln(out, "restored the resolver file the reference lockdown had blanked")
			}
			if err != nil {
				return fmt.Errorf("migrate-reference: %w", err)
			}
			return nil
		},
	}
}

// noSystemd stands in where systemd is not running: it knows no units.
type noSystemd struct{}

func (noSystemd) UnitExists(context.Context, string) (bool, error) { return false, nil }
func (noSystemd) StopAndDisable(context.Context, string) error     { return nil }
func (noSystemd) Reload(context.Context) error                     { return nil }
func (noSystemd) Mask(context.Context, string) error               { return nil }
func (noSystemd) Masked(context.Context, string) (bool, error)     { return false, nil }
