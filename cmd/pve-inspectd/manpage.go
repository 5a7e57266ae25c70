package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// newManpageCmd renders one man page (section 8) that covers every verb;
// the package build ships it.
func newManpageCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "manpage",
		Short:  "print the pve-inspectd(8) man page (roff)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeManpage(cmd.OutOrStdout(), cmd.Root(), time.Now())
		},
	}
}

// roffEscape escapes text for roff: backslashes, and a leading dot or quote.
func roffEscape(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			lines[i] = `\&` + l
		}
	}
	return strings.Join(lines, "\n")
}

func writeManpage(w io.Writer, root *cobra.Command, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, ".TH PVE-INSPECTD 8 %q \"pve-inspectd %s\" \"System Administration\"\n", now.Format("2006-01-02"), roffEscape(version))
	fmt.Fprintf(&b, ".SH NAME\npve\\-inspectd \\- %s\n", roffEscape(root.Short))
	b.WriteString(".SH SYNOPSIS\n.B pve\\-inspectd\n[\\fIglobal options\\fR] \\fIverb\\fR [\\fIoptions\\fR]\n")
	b.WriteString(".SH DESCRIPTION\n")
	if root.Long != "" {
		b.WriteString(roffEscape(root.Long) + "\n")
	} else {
		b.WriteString(roffEscape(root.Short) + ".\n")
	}
	b.WriteString(".SH GLOBAL OPTIONS\n")
	writeFlags(&b, root.PersistentFlags())
	b.WriteString(".SH VERBS\n")
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			if sub.Runnable() {
				fmt.Fprintf(&b, ".SS %s\n", roffEscape(strings.TrimPrefix(sub.UseLine(), "pve-inspectd ")))
				desc := sub.Long
				if desc == "" {
					desc = sub.Short
				}
				b.WriteString(roffEscape(desc) + "\n")
				if sub.HasLocalFlags() {
					b.WriteString(".PP\nOptions:\n")
					writeFlags(&b, sub.LocalNonPersistentFlags())
				}
			}
			walk(sub)
		}
	}
	walk(root)
	b.WriteString(".SH FILES\n.TP\n.I /etc/pve-inspectd/config.toml\nconfiguration; every key is documented in the shipped file\n" +
		".TP\n.I /etc/inspect\\-proxmox\\-egress\\-lockdown\nthe egress lockdown marker\n" +
		".TP\n.I /run/pve-inspectd/halted\nthe reason of a fail\\-deadly halt\n")
	b.WriteString(".SH EXIT STATUS\n0 on success; non\\-zero on any error, for \\fBstatus\\fR when anything differs from what should be in force, " +
		"and for \\fBdoctor\\fR when any check fails (each failure says what to change).\n")
	b.WriteString(".SH AFTER INSTALL\nRun \\fBpve\\-inspectd doctor\\fR as root on the node, then \\fBpve\\-inspectd doctor \\-\\-canary\\fR with the daemon running; " +
		"attach the output of \\fBpve\\-inspectd doctor \\-\\-canary \\-\\-json\\fR to a bug report.\n")
	b.WriteString(".SH SEE ALSO\n.BR nft (8),\n.BR systemd.service (5)\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func writeFlags(b *strings.Builder, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name := "\\-\\-" + roffEscape(f.Name)
		if f.Shorthand != "" {
			name = "\\-" + f.Shorthand + ", " + name
		}
		if t := f.Value.Type(); t != "bool" {
			name += " \\fI" + t + "\\fR"
		}
		fmt.Fprintf(b, ".TP\n.B %s\n%s", name, roffEscape(f.Usage))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
			fmt.Fprintf(b, " (default: %s)", roffEscape(f.DefValue))
		}
		b.WriteString("\n")
	})
}
