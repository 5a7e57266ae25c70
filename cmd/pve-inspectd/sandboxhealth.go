package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// clientRun is newSandboxCmd's withClient: it gives run a client and a
// context bounded by --timeout.
type clientRun func(run func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error

// newHealthCmds are `sandbox health` and `sandbox events`.
func newHealthCmds(withClient clientRun) []*cobra.Command {
	var asJSON bool
	health := &cobra.Command{
		Use:   "health SANDBOX",
		Short: "print a sandbox's health: state, reason, and each VM's host-side signals (guest-reported facts marked)",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			sb, err := c.Get(ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), sb.Health)
			}
			printHealth(cmd.OutOrStdout(), sb)
			return nil
		}),
	}
	health.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var (
		sandboxes, types []string
		last             uint64
	)
	events := &cobra.Command{
		Use:   "events",
		Short: "follow the event stream (one JSON event a line) until interrupted or --timeout",
		Args:  cobra.NoArgs,
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, _ []string) error {
			err := c.Events(ctx, client.EventsRequest{Sandboxes: sandboxes, Types: types, LastEventID: last, Resume: cmd.Flags().Changed("last-event-id")},
				func(e apitype.Event) error { return printJSONLine(cmd.OutOrStdout(), e) })
			if ctx.Err() != nil {
				return nil
			}
			return err
		}),
	}
	events.Flags().StringSliceVar(&sandboxes, "sandbox", nil, "only these sandboxes (repeatable)")
	events.Flags().StringSliceVar(&types, "type", nil, "only these event types (repeatable): "+strings.Join(apitype.EventTypes(), ", "))
	events.Flags().Uint64Var(&last, "last-event-id", 0, "resume after this event id (0: everything buffered)")
	return []*cobra.Command{health, events}
}

// printJSONLine writes v as one line of JSON.
func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// printHealth prints a sandbox's health as a table.
func printHealth(w io.Writer, sb apitype.Sandbox) {
	h := sb.Health
	if h == nil {
		fmt.Fprintf(w, "sandbox %s (%s): not checked yet\n", sb.ID, sb.State)
		return
	}
	fmt.Fprintf(w, "sandbox %s: %s", sb.ID, h.State)
	if h.Reason != "" {
		fmt.Fprintf(w, " (%s): %s", h.Reason, h.Detail)
	}
	fmt.Fprintf(w, " since %s\n", h.Since.Format("2006-01-02T15:04:05Z07:00"))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tVMID\tSTATE\tREASON\tSTATUS/QMP\tAGENT\tCPU s\tMEM MiB (PEAK)\tOOM\tNET TO/FROM GUEST\tGUEST-REPORTED FS")
	for _, v := range h.VMs {
		agent := fmt.Sprintf("silent %.0fs", v.Host.SecondsSinceAgentAnswer)
		switch {
		case v.Host.NoAgent:
			agent = "none" // created with agent false: never pinged
		case v.Host.AgentOK:
			agent = fmt.Sprintf("ok %.1fms", v.Host.AgentRTTSeconds*1000)
		}
		var fs []string
		if v.GuestReported != nil {
			for _, f := range v.GuestReported.Filesystems {
				if f.TotalBytes > 0 {
					fs = append(fs, fmt.Sprintf("%s %.0f%%", f.Mountpoint, float64(f.UsedBytes)*100/float64(f.TotalBytes)))
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s/%s\t%s\t%.1f\t%d (%d)\t%d\t%d/%d\t%s\n", v.Name, v.VMID, v.State, v.Reason, v.Host.Status, v.Host.QMPStatus, agent,
			v.Host.CPUSeconds, v.Host.MemoryBytes>>20, v.Host.MemoryPeakBytes>>20, v.Host.OOMKills, v.Host.NetBytesToGuest, v.Host.NetBytesFromGuest, strings.Join(fs, " "))
	}
	_ = tw.Flush()
}

// healthWord is a sandbox's health for the list ("-" before its first
// check).
func healthWord(sb apitype.Sandbox) string {
	if sb.Health == nil {
		return "-"
	}
	if sb.Health.Reason != "" {
		return sb.Health.State + "(" + sb.Health.Reason + ")"
	}
	return sb.Health.State
}
