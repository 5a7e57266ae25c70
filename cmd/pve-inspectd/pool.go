package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// writePoolPlan prints the warm pool's shapes and the memory and vCPUs
// they hold idle (part of `plan`).
func writePoolPlan(w io.Writer, p config.PoolSection) error {
	shapes, err := p.EngineShapes()
	if err != nil {
		return err
	}
	if len(shapes) == 0 {
		fmt.Fprintf(w, "\nwarm pool: off (no [[pool.shapes]])\n")
		return nil
	}
	var mem, cores, vms, cts int
	for _, s := range shapes {
		mem += s.Target * s.MemoryMiB
		cores += s.Target * s.Cores
		if s.Kind == apitype.KindLXC {
			cts += s.Target
		} else {
			vms += s.Target
		}
	}
	held := fmt.Sprintf("%d VMs", vms)
	if cts > 0 {
		held += fmt.Sprintf(", %d containers", cts)
	}
	fmt.Fprintf(w, "\nwarm pool (checked and refilled every %s; holds %s, %d vCPUs, %d MiB idle at its targets):\n", p.Interval, held, cores, mem)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SHAPE\tKIND\tTEMPLATE\tCORES\tMEMORY\tNETWORKS\tEGRESS\tTARGET\tMAX AGE")
	for _, s := range shapes {
		age := "never"
		if s.MaxAge > 0 {
			age = s.MaxAge.String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d MiB\t%s\t%s\t%d\t%s\n", s.Name, s.Kind, s.Template, s.Cores, s.MemoryMiB, strings.Join(s.Networks, ","), s.Egress, s.Target, age)
	}
	return tw.Flush()
}

// printPool prints `sandbox list --pool`: the shapes, then the members.
func printPool(w io.Writer, st apitype.PoolStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHAPE\tKIND\tTEMPLATE\tCORES\tMEMORY\tEGRESS\tREADY\tBUILDING\tTARGET")
	for _, s := range st.Shapes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d MiB\t%s\t%d\t%d\t%d\n", s.Name, s.Kind, s.Template, s.Cores, s.MemoryMiB, s.Egress, s.Ready, s.Building, s.Target)
	}
	for _, s := range st.Shapes {
		if s.Error != "" {
			fmt.Fprintf(tw, "shape %s cannot refill: %s\n", s.Name, s.Error)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "MEMBER\tSHAPE\tSTATE\tVMS\tNETWORKS\tAGE")
	for _, m := range st.Members {
		var vms []string
		for _, id := range m.VMIDs {
			vms = append(vms, fmt.Sprint(id))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Shape, m.State, strings.Join(vms, ","), strings.Join(m.CIDRs, ","),
			(time.Duration(m.AgeSeconds) * time.Second).String())
	}
	return tw.Flush()
}
