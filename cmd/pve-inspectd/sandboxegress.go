package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// newEgressLogCmd is `sandbox egress-log SANDBOX`: a page of the
// sandbox's egress record (GET .../egress/log), every page with --all.
func newEgressLogCmd(withClient clientRun) *cobra.Command {
	var (
		q      apitype.EgressLogQuery
		all    bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "egress-log SANDBOX",
		Short: "print a sandbox's egress record: the DNS questions its guests asked and the connections the proxy handled, with verdicts and bytes",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			page, err := c.EgressLog(ctx, args[0], q)
			if err != nil {
				return err
			}
			for all && page.More {
				q.Since = page.Next
				next, err := c.EgressLog(ctx, args[0], q)
				if err != nil {
					return err
				}
				page.Records, page.Next, page.More, page.Dropped = append(page.Records, next.Records...), next.Next, next.More, next.Dropped
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), page)
			}
			printEgressLog(cmd.OutOrStdout(), page)
			return nil
		}),
	}
	cmd.Flags().StringVar(&q.Type, "type", "", "only dns, conn or flow records")
	cmd.Flags().StringVar(&q.VM, "vm", "", "only this VM's records")
	cmd.Flags().Uint64Var(&q.Since, "since", 0, "only records after this seq")
	cmd.Flags().IntVar(&q.Limit, "limit", 0, "the most records of a page (default: the server's, 1000)")
	cmd.Flags().BoolVar(&all, "all", false, "every page, not just the first")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// deleteKeepingEgress is `sandbox delete SANDBOX --egress-log [--json]`:
// the sandbox deleted and its whole egress record printed as
// `sandbox egress-log` prints a page, or one JSON record a line as the
// daemon streams them.
func deleteKeepingEgress(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string, ndjson bool) error {
	if len(args) != 1 {
		return fmt.Errorf("--egress-log deletes one sandbox at a time, not %d", len(args))
	}
	out := cmd.OutOrStdout()
	if ndjson {
		_, err := c.DeleteKeepingEgressStream(ctx, args[0], func(r apitype.EgressRecord) error { return printJSONLine(out, r) })
		return err
	}
	l, err := c.DeleteKeepingEgress(ctx, args[0])
	if err != nil {
		return err
	}
	printEgressLog(out, l)
	return nil
}

// printEgressLog prints a page of the egress record as a table.
func printEgressLog(w io.Writer, l apitype.EgressLog) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tVM\tTYPE\tVERDICT\tNAME\tDEST/ANSWERS\tOUT\tIN")
	for _, r := range l.Records {
		verdict := r.Verdict
		if r.Reason != "" {
			verdict += " (" + r.Reason + ")"
		}
		vm := r.VM
		if vm == "" {
			vm = r.Source
		}
		name, dest := r.Name, r.Dest
		switch r.Type {
		case "dns":
			name += " " + r.QType
			dest = strings.Join(r.Answers, ",")
		case "flow":
			name = r.Proto
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", r.Seq, r.Time.Format("15:04:05.000"), vm, r.Type, verdict, name, dest, r.BytesOut, r.BytesIn)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d records", len(l.Records))
	if l.Dropped > 0 {
		fmt.Fprintf(w, ", %d dropped by the bounds", l.Dropped)
	}
	if l.More {
		fmt.Fprintf(w, "; more after --since %d", l.Next)
	}
	fmt.Fprintln(w)
}
