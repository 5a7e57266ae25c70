package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/provision"
)

type nodeFlags struct {
	config string
	root   string
	json   bool
}

func newNodeCmd(d *deps) *cobra.Command {
	f := &nodeFlags{}
	cmd := &cobra.Command{
		Use:   "node",
		Short: "run the provisioning recipe on this machine (plan, apply, status)",
	}
	cmd.PersistentFlags().StringVarP(&f.config, "config", "c", provision.DefaultConfigPath, "recipe configuration file")
	cmd.PersistentFlags().StringVar(&f.root, "root", "/", "file system root the recipe reads and writes (tests)")
	_ = cmd.PersistentFlags().MarkHidden("root")
	cmd.PersistentFlags().BoolVar(&f.json, "json", false, "machine-readable output")
	cmd.AddCommand(
		&cobra.Command{
			Use: "plan", Short: "print each step and whether apply would change it", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				e, err := d.engine(f)
				if err != nil {
					return err
				}
				items, err := e.Plan(cmd.Context())
				if err != nil {
					return err
				}
				if f.json {
					return writeJSON(cmd.OutOrStdout(), items)
				}
				return printPlan(cmd.OutOrStdout(), items)
			},
		},
		&cobra.Command{
			Use: "apply", Short: "apply the steps not yet done; resumes itself after reboots", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				e, err := d.engine(f)
				if err != nil {
					return err
				}
				if kind := e.Env.Config.Report; kind != "" {
					rep, err := d.reporter(cmd.Context(), kind)
					if err != nil {
						e.Env.Log.Warn("no progress reporting", "report", kind, "err", err)
					} else {
						e.Report = rep
					}
				}
				out, err := e.Apply(cmd.Context())
				if err != nil {
					return err
				}
				switch out {
				case provision.Rebooting:
					fmt.Fprintf(cmd.OutOrStdout(), "rebooting; %s resumes apply after boot\n", provision.ResumeUnit)
				default:
					fmt.Fprintln(cmd.OutOrStdout(), "node complete: every step is done")
				}
				return nil
			},
		},
		&cobra.Command{
			Use:   "identity",
			Short: "on a new instance (an image launched again): new host name and hosts entry, root password, API token and node certificate; nothing else",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				e, err := d.engine(f)
				if err != nil {
					return err
				}
				id, changed, err := e.Identity(cmd.Context())
				if err != nil {
					return err
				}
				if !changed {
					fmt.Fprintf(cmd.OutOrStdout(), "instance %s: identity already made; nothing to do\n", id)
					return nil
				}
				fmt.Fprintf(cmd.OutOrStdout(), "instance %s: new identity made (%s)\n", id, strings.Join(provision.IdentitySteps, ", "))
				return nil
			},
		},
		&cobra.Command{
			Use: "status", Short: "print each step's recorded state", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				e, err := d.engine(f)
				if err != nil {
					return err
				}
				items, st, err := e.Status()
				if err != nil {
					return err
				}
				if f.json {
					return writeJSON(cmd.OutOrStdout(), map[string]any{
						"steps": items, "boot_id": st.BootID, "reboot": st.Reboot, "completed": st.Completed,
					})
				}
				return printStatus(cmd.OutOrStdout(), items, st)
			},
		},
	)
	return cmd
}

// engine builds the recipe engine from the flags.
func (d *deps) engine(f *nodeFlags) (*provision.Engine, error) {
	cfgPath, err := filepath.Abs(f.config)
	if err != nil {
		return nil, err
	}
	root := provision.Root(f.root)
	cfg, err := provision.LoadConfig(root.Path(cfgPath))
	if err != nil {
		return nil, err
	}
	self, err := d.executable()
	if err != nil {
		return nil, fmt.Errorf("find own binary: %w", err)
	}
	resume := []string{self, "node", "apply", "--config", cfgPath}
	if f.root != "/" {
		resume = append(resume, "--root", f.root)
	}
	return &provision.Engine{
		Env: &provision.Env{
			Config: cfg, Root: root, Runner: d.runner, Addrs: d.addrs, Fetcher: d.fetcher(root),
			Log: d.logger("provision"), Random: d.random,
			IdentityArgv: append([]string{self, "node", "identity", "--config", cfgPath}, resume[5:]...),
		},
		Steps:      provision.Recipe(),
		ResumeArgv: resume,
	}, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printPlan(w io.Writer, items []provision.PlanItem) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tACTION\tREBOOT\tDESCRIPTION")
	n := map[string]int{}
	for _, it := range items {
		rb := ""
		if it.Reboot {
			rb = "yes"
		}
		desc := it.Description
		if it.Note != "" {
			desc += " (" + it.Note + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", it.ID, it.Action, rb, desc)
		n[it.Action]++
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d to apply, %d done, %d skipped\n", n["apply"], n["none"], n["skip"])
	return err
}

func printStatus(w io.Writer, items []provision.StatusItem, st *provision.State) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATUS\tAT")
	for _, it := range items {
		at := ""
		if !it.At.IsZero() {
			at = it.At.UTC().Format("2006-01-02T15:04:05Z")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", it.ID, it.Status, at)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if st.Reboot != nil {
		fmt.Fprintf(w, "reboot requested after %s (boot %s)\n", st.Reboot.AfterStep, st.Reboot.BootID)
	}
	for _, it := range items {
		if it.Status == provision.StatusFailed && it.Output != "" {
			fmt.Fprintf(w, "--- output of failed step %s ---\n%s\n", it.ID, it.Output)
		}
	}
	if !st.Completed.IsZero() {
		fmt.Fprintf(w, "completed %s\n", st.Completed.UTC().Format("2006-01-02T15:04:05Z"))
	}
	return nil
}
