package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cloud/kvm"
	"github.com/pve-inspect/pve-inspect/provision"
)

type forwardFlags struct {
	listen      string
	apiPort     int
	sandboxPort int
	sandboxTo   int
}

func (f *forwardFlags) register(cmd *cobra.Command, api, sandbox int) {
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1", "host address the forwarded ports bind to")
	cmd.Flags().IntVar(&f.apiPort, "api-port", api, "host port forwarded to the node's Proxmox API (8006)")
	cmd.Flags().IntVar(&f.sandboxPort, "sandbox-port", sandbox, "host port forwarded to the node's sandbox API")
	cmd.Flags().IntVar(&f.sandboxTo, "sandbox-guest-port", 8443, "the sandbox API's port on the node")
}

func (f *forwardFlags) forwards() []kvm.Forward {
	return []kvm.Forward{
		{Name: "proxmox-api", HostAddr: f.listen, HostPort: f.apiPort, GuestPort: 8006},
		{Name: "sandbox-api", HostAddr: f.listen, HostPort: f.sandboxPort, GuestPort: f.sandboxTo},
	}
}

func newNestedCmd(d *deps) *cobra.Command {
	var dir string
	cmd := &cobra.Command{Use: "nested", Short: "Proxmox nodes as nested VMs on this KVM host"}
	cmd.PersistentFlags().StringVar(&dir, "dir", kvm.DefaultDir, "where nested nodes live")
	mgr := func() *kvm.Manager {
		return &kvm.Manager{Dir: dir, Runner: d.runner, HTTP: d.http, SysRoot: "/"}
	}

	ud := &userDataFlags{}
	fw := &forwardFlags{}
	var o kvm.CreateOptions
	var imageURL, sumsURL string
	create := &cobra.Command{
		Use: "create NAME", Short: "create and start a nested node from the Debian 13 cloud image", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !kvm.ValidName(name) {
				return fmt.Errorf("node name %q: want lowercase letters, digits and dashes", name)
			}
			doc, _, err := ud.render(func(c *provision.Config) { c.Hostname = name; c.Network.Mode = "nat" })
			if err != nil {
				return err
			}
			o.Name, o.UserData, o.Forwards = name, doc, fw.forwards()
			o.Image = kvm.Image{URL: imageURL, SumsURL: sumsURL}
			n, err := mgr().Create(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printNode(cmd, n)
		},
	}
	ud.register(create)
	fw.register(create, 18006, 18443)
	fl := create.Flags()
	fl.IntVar(&o.CPUs, "cpus", 4, "virtual CPUs")
	fl.IntVar(&o.MemoryMiB, "memory", 8192, "memory in MiB")
	fl.IntVar(&o.DiskGiB, "disk", 64, "disk size in GiB")
	fl.StringVar(&o.Accel, "accel", "kvm", "kvm (host CPU, nested) or tcg (slow; no nested guests)")
	fl.StringVar(&o.CacheDir, "cache-dir", "/var/cache/pve-bootstrap/images", "verified cloud images")
	fl.StringVar(&imageURL, "image-url", kvm.DefaultImageURL, "Debian 13 cloud image")
	fl.StringVar(&sumsURL, "sums-url", kvm.DefaultSumsURL, "SHA512SUMS that vouches for the image")

	list := &cobra.Command{
		Use: "list", Short: "list nested nodes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nodes, err := mgr().List()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tINSTANCE\tFORWARDS")
			for _, n := range nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.Name, state(n), n.InstanceID, forwardsText(n.Forwards))
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "stop a nested node and remove its disk", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return mgr().Delete(cmd.Context(), args[0]) },
	}
	stop := &cobra.Command{
		Use: "stop NAME", Short: "stop a nested node's VM", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return mgr().Stop(cmd.Context(), args[0], 60*time.Second)
		},
	}
	start := &cobra.Command{
		Use: "start NAME", Short: "start a stopped nested node", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return mgr().Start(cmd.Context(), args[0]) },
	}
	cfw := &forwardFlags{}
	clone := &cobra.Command{
		Use: "clone SOURCE NAME", Short: "make another node from a stopped one, with fresh per-instance secrets", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := mgr().Clone(cmd.Context(), args[0], args[1], cfw.forwards())
			if err != nil {
				return err
			}
			return printNode(cmd, n)
		},
	}
	cfw.register(clone, 28006, 28443)
	cmd.AddCommand(create, list, del, stop, start, clone)
	return cmd
}

func state(n kvm.Node) string {
	if n.Running {
		return fmt.Sprintf("running (pid %d)", n.PID)
	}
	return "stopped"
}

func forwardsText(fs []kvm.Forward) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%s:%d->%d", f.HostAddr, f.HostPort, f.GuestPort))
	}
	return strings.Join(s, ",")
}

func printNode(cmd *cobra.Command, n kvm.Node) error {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "node %s: %s, instance %s\n", n.Name, state(n), n.InstanceID)
	for _, f := range n.Forwards {
		if f.GuestPort == 8006 {
			fmt.Fprintf(w, "  proxmox     https://%s:%d/\n", f.HostAddr, f.HostPort)
		} else {
			fmt.Fprintf(w, "  %-11s %s:%d\n", f.Name, f.HostAddr, f.HostPort)
		}
	}
	fmt.Fprintf(w, "  console log %s/serial.log (the recipe's progress; then `pve-bootstrap node status` on the node)\n", n.Dir)
	return nil
}
