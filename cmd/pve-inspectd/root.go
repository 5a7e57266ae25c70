package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
)

// globals are the flags every verb shares.
type globals struct {
	configPath string
	logLevel   slog.LevelVar
}

// loadConfig reads the configuration; a missing file at the default path
// means defaults, a missing file named on the command line is an error.
func (g *globals) loadConfig() (config.Config, error) {
	return config.Load(g.configPath, g.configPath == config.DefaultPath)
}

// logger returns the structured logger every part derives from.
func (g *globals) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: &g.logLevel}))
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "pve-inspectd",
		Short:         "pve-inspect node daemon: host guard, egress lockdown, sandbox API",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVarP(&g.configPath, "config", "c", config.DefaultPath, "configuration file")
	root.AddCommand(
		newVersionCmd(),
		newManpageCmd(),
		newMigrateCmd(g),
		newHaltCmd(g), newRecoverCmd(g, lockdownCause),
		newLockdownCmd(g),
		newSandboxCmd(g), newCheckCmd(g), newTokenCmd(g), newMCPCmd(g), newTemplateCmd(g), newDoctorCmd(g),
	)
	root.AddCommand(newGuardCmds(g)...)
	return root
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := cmd.OutOrStdout().Write([]byte(version + "\n"))
			return err
		},
	}
}
