package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/lockdown/legacy"
)

// newMigrateCmd takes the node over from the reference provisioning
// scripts; the package's postinst runs it.
func newMigrateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate-reference",
		Short: "disable the reference scripts' units and remove their iptables rules (keeps the lockdown marker)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			sd, err := legacy.NewDBusSystemd(ctx)
			if err != nil {
				return fmt.Errorf("migrate-reference: %w", err)
			}
			defer sd.Close()
			rep, err := (&legacy.Takeover{Systemd: sd, Exec: legacy.ExecRunner, Root: "/"}).Run(ctx)
			out := cmd.OutOrStdout()
			for _, u := range rep.UnitsDisabled {
				fmt.Fprintf(out, "disabled reference unit %s\n", u)
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
