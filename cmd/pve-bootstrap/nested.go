package main

import (
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cloud/kvm"
	"github.com/pve-inspect/pve-inspect/provision"
)

// libvirtFlags say which libvirtd to use and where nodes live in it.
type libvirtFlags struct {
	uri, bridge, subnet, pool, poolDir, logDir string
}

func (f *libvirtFlags) register(cmd *cobra.Command) {
	fl := cmd.PersistentFlags()
	fl.StringVar(&f.uri, "connect", kvm.DefaultURI, "libvirt connection URI")
	fl.StringVar(&f.subnet, "subnet", kvm.DefaultSubnet, "IPv4 subnet of the "+kvm.DefaultNetwork+" NAT network when it is created")
	fl.StringVar(&f.bridge, "bridge", kvm.DefaultBridge, "bridge of the "+kvm.DefaultNetwork+" network when it is created")
	fl.StringVar(&f.pool, "pool", kvm.DefaultPool, "libvirt storage pool for the nodes' volumes (created when missing)")
	fl.StringVar(&f.poolDir, "pool-dir", kvm.DefaultPoolDir, "directory of the storage pool when it is created")
	fl.StringVar(&f.logDir, "serial-log-dir", kvm.DefaultLogDir, "where each node's serial console is logged")
}

func (f *libvirtFlags) dial(cmd *cobra.Command, d *deps) (*kvm.Manager, error) {
	subnet, err := netip.ParsePrefix(f.subnet)
	if err != nil {
		return nil, fmt.Errorf("--subnet %q: %w", f.subnet, err)
	}
	return kvm.Dial(cmd.Context(), kvm.Config{
		URI: f.uri, Network: kvm.DefaultNetwork, Bridge: f.bridge, Subnet: subnet,
		Pool: f.pool, PoolDir: f.poolDir, LogDir: f.logDir, SysRoot: "/", HTTP: d.http,
	})
}

// withManager runs f with a connected manager and closes it after.
func (f *libvirtFlags) withManager(cmd *cobra.Command, d *deps, run func(*kvm.Manager) error) error {
	m, err := f.dial(cmd, d)
	if err != nil {
		return err
	}
	defer m.Close()
	return run(m)
}

func newNestedCmd(d *deps) *cobra.Command {
	lf := &libvirtFlags{}
	cmd := &cobra.Command{Use: "nested", Short: "Proxmox nodes as nested VMs in this host's libvirt"}
	lf.register(cmd)
	cmd.AddCommand(newNestedCreateCmd(d, lf))
	cmd.AddCommand(newNestedVerbs(d, lf)...)
	return cmd
}

func newNestedCreateCmd(d *deps, lf *libvirtFlags) *cobra.Command {
	ud := &userDataFlags{}
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
			o.Name, o.UserData = name, doc
			o.Image = kvm.Image{URL: imageURL, SumsURL: sumsURL}
			return lf.withManager(cmd, d, func(m *kvm.Manager) error {
				n, err := m.Create(cmd.Context(), o)
				if err != nil {
					return err
				}
				printNode(cmd.OutOrStdout(), n)
				return nil
			})
		},
	}
	ud.register(create)
	fl := create.Flags()
	fl.IntVar(&o.CPUs, "cpus", 4, "virtual CPUs")
	fl.IntVar(&o.MemoryMiB, "memory", 8192, "memory in MiB")
	fl.IntVar(&o.DiskGiB, "disk", 64, "disk size in GiB")
	fl.StringVar(&o.Accel, "accel", "kvm", "kvm (host CPU, nested) or tcg (slow; no nested guests)")
	fl.StringVar(&o.Network, "network", kvm.DefaultNetwork, "libvirt network (only "+kvm.DefaultNetwork+" is created when missing)")
	fl.BoolVar(&o.NoAutostart, "no-autostart", false, "do not start the node when the host boots")
	fl.StringVar(&o.CacheDir, "cache-dir", "/var/cache/pve-bootstrap/images", "verified cloud images")
	fl.StringVar(&imageURL, "image-url", kvm.DefaultImageURL, "Debian 13 cloud image")
	fl.StringVar(&sumsURL, "sums-url", kvm.DefaultSumsURL, "SHA512SUMS that vouches for the image")
	return create
}

// newNestedVerbs are list, delete, stop, start and clone.
func newNestedVerbs(d *deps, lf *libvirtFlags) []*cobra.Command {
	list := &cobra.Command{
		Use: "list", Short: "list nested nodes (domains tagged by pve-bootstrap)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lf.withManager(cmd, d, func(m *kvm.Manager) error {
				nodes, err := m.List()
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tAPI\tAUTOSTART\tINSTANCE")
				for _, n := range nodes {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\n", n.Name, n.State, n.Address, n.APIURL, n.Autostart, n.InstanceID)
				}
				return tw.Flush()
			})
		},
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "power a nested node off and remove its domain, volumes and address", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.withManager(cmd, d, func(m *kvm.Manager) error { return m.Delete(cmd.Context(), args[0]) })
		},
	}
	var grace time.Duration
	stop := &cobra.Command{
		Use: "stop NAME", Short: "shut a nested node down (powered off after --grace)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.withManager(cmd, d, func(m *kvm.Manager) error { return m.Stop(cmd.Context(), args[0], grace) })
		},
	}
	stop.Flags().DurationVar(&grace, "grace", 2*time.Minute, "how long the guest may take to shut down")
	start := &cobra.Command{
		Use: "start NAME", Short: "start a stopped nested node", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.withManager(cmd, d, func(m *kvm.Manager) error { return m.Start(cmd.Context(), args[0]) })
		},
	}
	clone := &cobra.Command{
		Use: "clone SOURCE NAME", Short: "make another node from a stopped one, with fresh per-instance secrets", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.withManager(cmd, d, func(m *kvm.Manager) error {
				n, err := m.Clone(cmd.Context(), args[0], args[1])
				if err != nil {
					return err
				}
				printNode(cmd.OutOrStdout(), n)
				return nil
			})
		},
	}
	return []*cobra.Command{list, del, stop, start, clone}
}

func printNode(w io.Writer, n kvm.Node) {
	fmt.Fprintf(w, "node %s: %s, instance %s, autostart %v\n", n.Name, n.State, n.InstanceID, n.Autostart)
	fmt.Fprintf(w, "  address     %s (reserved in libvirt network %s)\n", n.Address, n.Network)
	fmt.Fprintf(w, "  proxmox     %s\n", n.APIURL)
	fmt.Fprintf(w, "  console     virsh console %s (log: %s; the recipe's progress, then `pve-bootstrap node status` on the node)\n", n.Name, n.SerialLog)
}
