package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// apiFlags say how the CLI reaches the sandbox API.
type apiFlags struct {
	socket  string
	addr    string
	caFile  string
	timeout time.Duration
}

func (f *apiFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.socket, "socket", "", "API unix socket (default: api.socket from the config)")
	cmd.PersistentFlags().StringVar(&f.addr, "addr", "", "API TCP address host:port (TLS; token from $PVE_INSPECT_TOKEN)")
	cmd.PersistentFlags().StringVar(&f.caFile, "ca-file", "/etc/pve/pve-root-ca.pem", "CA that signed the API certificate (with --addr)")
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", 15*time.Minute, "deadline of the whole command")
}

// client builds the API client from the flags and the configuration.
func (f *apiFlags) client(g *globals) (*client.Client, error) {
	if f.addr != "" {
		tok := os.Getenv("PVE_INSPECT_TOKEN")
		if tok == "" {
			return nil, errors.New("--addr needs a bearer token in $PVE_INSPECT_TOKEN")
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if f.caFile != "" {
			pem, err := os.ReadFile(f.caFile)
			if err != nil {
				return nil, fmt.Errorf("read CA: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("no certificate in %s", f.caFile)
			}
		}
		return client.NewTLS(f.addr, cfg, client.WithToken(tok)), nil
	}
	sock := f.socket
	if sock == "" {
		c, err := g.loadConfig()
		if err != nil {
			return nil, err
		}
		sock = c.API.Socket
	}
	return client.NewUnix(sock), nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newSandboxCmd(g *globals) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{Use: "sandbox", Short: "create, list, use and delete sandboxes through the sandbox API"}
	af.register(cmd)
	withClient := func(run func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			c, err := af.client(g)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), af.timeout)
			defer cancel()
			return run(ctx, c, cmd, args)
		}
	}

	var (
		file                   string
		templates, labels, nws []string
		ctTemplates, offline   []string
		cores, mem, disk       int
		ttl                    time.Duration
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "create a sandbox (one VM per --template) and print it as JSON",
		Example: "  pve-inspectd sandbox create --template debian --template debian --ttl 2h --label eval=ctf\n" +
			"  pve-inspectd sandbox create --template debian --ct-template ct-debian\n" +
			"  pve-inspectd sandbox create --template debian --no-network-template debian\n" +
			"  pve-inspectd sandbox create -f request.json",
		Args: cobra.NoArgs,
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, _ []string) error {
			var req apitype.CreateRequest
			if file != "" {
				b, err := readFileOrStdin(file)
				if err != nil {
					return err
				}
				dec := json.NewDecoder(strings.NewReader(string(b)))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&req); err != nil {
					return fmt.Errorf("request %s: %w", file, err)
				}
			}
			for _, t := range templates {
				req.VMs = append(req.VMs, apitype.VMRequest{Template: t, Cores: cores, MemoryMiB: mem, DiskGiB: disk})
			}
			for _, t := range ctTemplates {
				req.VMs = append(req.VMs, apitype.VMRequest{Kind: apitype.KindLXC, Template: t, Cores: cores, MemoryMiB: mem})
			}
			for _, t := range offline {
				req.VMs = append(req.VMs, apitype.VMRequest{Template: t, Cores: cores, MemoryMiB: mem, DiskGiB: disk, NoNetwork: true})
			}
			for _, n := range nws {
				name, cidr, _ := strings.Cut(n, "=")
				req.Networks = append(req.Networks, apitype.NetworkRequest{Name: name, CIDR: cidr})
			}
			if len(labels) > 0 && req.Labels == nil {
				req.Labels = map[string]string{}
			}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok {
					return fmt.Errorf("--label %q: want key=value", l)
				}
				req.Labels[k] = v
			}
			if ttl > 0 {
				req.TTLSeconds = int64(ttl / time.Second)
			}
			if len(req.VMs) == 0 {
				return errors.New("no VM: give --template, --ct-template, --no-network-template or -f")
			}
			sb, err := c.Create(ctx, req)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), sb)
		}),
	}
	create.Flags().StringVarP(&file, "file", "f", "", "JSON CreateRequest (\"-\" = stdin)")
	create.Flags().StringArrayVar(&templates, "template", nil, "template of one more VM (repeatable)")
	create.Flags().StringArrayVar(&ctTemplates, "ct-template", nil, "container template of one more member, an unprivileged container (kind lxc; repeatable)")
	create.Flags().StringArrayVar(&offline, "no-network-template", nil, "template of one more VM without any NIC (no_network: the loopback only; repeatable)")
	create.Flags().IntVar(&cores, "cores", 0, "vCPUs per --template VM and --ct-template container (default 1)")
	create.Flags().IntVar(&mem, "memory", 0, "MiB per --template VM and --ct-template container (default 1024)")
	create.Flags().IntVar(&disk, "disk", 0, "GiB boot disk per --template VM (default: the template's)")
	create.Flags().StringArrayVar(&nws, "network", nil, "network name=CIDR or name=auto (repeatable)")
	create.Flags().StringArrayVar(&labels, "label", nil, "label key=value (repeatable)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default: the server's)")

	var asJSON, pool bool
	list := &cobra.Command{
		Use:   "list",
		Short: "list sandboxes (--pool: the warm pool's shapes and unclaimed members)",
		Args:  cobra.NoArgs,
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, _ []string) error {
			if pool {
				st, err := c.Pool(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), st)
				}
				return printPool(cmd.OutOrStdout(), st)
			}
			l, err := c.List(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), l)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tHEALTH\tVMS\tNETWORKS\tEXPIRES\tOWNER")
			for _, s := range l {
				var vms, nets []string
				for _, v := range s.VMs {
					vm := fmt.Sprintf("%s(%d", v.Name, v.VMID)
					for _, a := range v.Addresses {
						vm += " " + a.IPv4
					}
					if v.NoNetwork {
						vm += " no network"
					}
					vms = append(vms, vm+")")
				}
				for _, n := range s.Networks {
					nets = append(nets, networkColumn(n))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.State, healthWord(s), strings.Join(vms, ","), strings.Join(nets, ","), s.ExpiresAt.Format(time.RFC3339), s.Owner)
			}
			return tw.Flush()
		}),
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	list.Flags().BoolVar(&pool, "pool", false, "list the warm pool instead of the sandboxes")

	var (
		user, cwd string
		env       []string
		execTO    time.Duration
		stdin     bool
	)
	execCmd := &cobra.Command{
		Use:   "exec SANDBOX VM -- ARGV...",
		Short: "run a command in a VM, streaming its output; exits with its exit code",
		Args:  cobra.MinimumNArgs(3),
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			req := apitype.ExecRequest{Argv: args[2:], User: user, Cwd: cwd, TimeoutSeconds: int64(execTO / time.Second)}
			if len(env) > 0 {
				req.Env = map[string]string{}
				for _, e := range env {
					k, v, _ := strings.Cut(e, "=")
					req.Env[k] = v
				}
			}
			if stdin {
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 4<<20))
				if err != nil {
					return err
				}
				req.Stdin = b
			}
			res, err := c.ExecStream(ctx, args[0], args[1], req, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if res.TimedOut {
				return &exitError{code: 124, msg: "command timed out"}
			}
			if res.ExitCode != 0 {
				return &exitError{code: res.ExitCode & 0xff}
			}
			return nil
		}),
	}
	execCmd.Flags().StringVar(&user, "user", "", "run as this user")
	execCmd.Flags().StringVar(&cwd, "cwd", "", "working directory")
	execCmd.Flags().StringArrayVar(&env, "env", nil, "environment KEY=VALUE (repeatable)")
	execCmd.Flags().DurationVar(&execTO, "exec-timeout", 0, "kill the command after this long")
	execCmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "send standard input (up to 4 MiB)")

	var modeStr string
	cp := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "copy a file into or out of a VM; one side is SANDBOX:VM:/path, the other a local path or -",
		Example: "  pve-inspectd sandbox cp ./task.tar sbq3x9ab:vm0:/root/task.tar\n" +
			"  pve-inspectd sandbox cp sbq3x9ab:vm0:/root/out.json -",
		Args: cobra.ExactArgs(2),
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			if sb, vm, p, ok := remote(dst); ok {
				if _, _, _, ok := remote(src); ok {
					return errors.New("copy between VMs: copy through a local file")
				}
				var r io.Reader = cmd.InOrStdin()
				size := int64(-1)
				if src != "-" {
					f, err := os.Open(src)
					if err != nil {
						return err
					}
					defer f.Close()
					fi, err := f.Stat()
					if err != nil {
						return err
					}
					r, size = f, fi.Size()
				}
				var mode uint64
				if modeStr != "" {
					m, err := strconv.ParseUint(modeStr, 8, 32)
					if err != nil || m > 0o777 {
						return fmt.Errorf("--mode %q: want octal such as 0755", modeStr)
					}
					mode = m
				}
				return c.WriteFile(ctx, sb, vm, p, r, size, uint32(mode))
			}
			sb, vm, p, ok := remote(src)
			if !ok {
				return errors.New("one side must be SANDBOX:VM:/path")
			}
			if dst == "-" {
				_, err := c.ReadFile(ctx, sb, vm, p, cmd.OutOrStdout())
				return err
			}
			tmp, err := os.CreateTemp(dirOf(dst), ".pve-inspectd-cp-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if _, err := c.ReadFile(ctx, sb, vm, p, tmp); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			return os.Rename(tmp.Name(), dst)
		}),
	}
	cp.Flags().StringVar(&modeStr, "mode", "", "octal mode of a new file in the VM (default 0644)")

	var delEgress, delJSON bool
	del := &cobra.Command{
		Use:   "delete SANDBOX...",
		Short: "delete sandboxes (no error when already gone); with --egress-log one sandbox, printing its whole egress record as it stood once its VMs were gone",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(func(ctx context.Context, c *client.Client, cmd *cobra.Command, args []string) error {
			if delEgress {
				return deleteKeepingEgress(ctx, c, cmd, args, delJSON)
			}
			if delJSON {
				return errors.New("--json goes with --egress-log")
			}
			var errs []error
			for _, id := range args {
				if err := c.Delete(ctx, id); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", id, err))
				}
			}
			return errors.Join(errs...)
		}),
	}
	del.Flags().BoolVar(&delEgress, "egress-log", false, "print the sandbox's egress record, handed over by the delete (one sandbox; an error, nothing deleted, when the node keeps none or the sandbox is gone)")
	del.Flags().BoolVar(&delJSON, "json", false, "with --egress-log: one JSON record a line (NDJSON)")
	cmd.AddCommand(create, list, execCmd, cp, del)
	cmd.AddCommand(newHealthCmds(withClient)...)
	cmd.AddCommand(newEgressLogCmd(withClient))
	return cmd
}

// remote splits SANDBOX:VM:/path.
func remote(s string) (sb, vm, path string, ok bool) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") || parts[0] == "" || parts[1] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		if i == 0 {
			return "/"
		}
		return p[:i]
	}
	return "."
}

func readFileOrStdin(p string) ([]byte, error) {
	if p == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	}
	return os.ReadFile(p)
}

func newCheckCmd(g *globals) *cobra.Command {
	var af apiFlags
	var vm string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check SANDBOX",
		Short: "run the containment check from inside a sandbox VM or container; exit 0 only when every probe passes",
		Long: `Run the containment check from inside a sandbox VM or container; exit 0 only when every probe passes.

From a container the check also tries what the container's root must not
do on the node's kernel (its id map, the node's /proc/sys and /sys,
mounts, keyrings, modules, nesting): each row must read denied.

In an allowlist sandbox the check tries an old keep-alive connection after a
policy change: it re-applies the sandbox's unchanged egress policy once,
which cuts every connection the egress proxy holds for the sandbox, its
agent's own included (clients reconnect).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client(g)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), af.timeout)
			defer cancel()
			rep, err := c.Check(ctx, args[0], vm)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				printCheck(cmd.OutOrStdout(), rep)
			}
			if !rep.Pass {
				return &exitError{code: 1, msg: "containment check failed"}
			}
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().StringVar(&vm, "vm", "", "VM or container to probe from (default: the first)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printCheck prints the check as a table.
func printCheck(w io.Writer, rep apitype.CheckReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "containment check of %s from %s\n", rep.Sandbox, rep.VM)
	fmt.Fprintln(tw, "TARGET\tPROBE\tEXPECTED\tOBSERVED\tRESULT")
	for _, r := range rep.Rows {
		res := "PASS"
		if !r.Pass {
			res = "FAIL"
		}
		target := r.Target
		if r.Control {
			target += " (control)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", target, r.Probe, r.Expected, r.Observed, res)
	}
	_ = tw.Flush()
	// what a failed row saw is what an operator needs next
	for _, r := range rep.Rows {
		if !r.Pass && r.Detail != "" {
			fmt.Fprintf(w, "FAIL %s (%s): %s\n", r.Target, r.Probe, r.Detail)
		}
	}
	if rep.Pass {
		fmt.Fprintln(w, "all probes PASS")
	} else {
		fmt.Fprintln(w, "some probes FAIL")
	}
	if rep.Sampling != nil {
		fmt.Fprintln(w, rep.Sampling.Note)
	}
	if h := rep.Health; h != nil {
		fmt.Fprintf(w, "sandbox health: %s", h.State)
		if h.Reason != "" {
			fmt.Fprintf(w, " (%s): %s", h.Reason, h.Detail)
		}
		fmt.Fprintln(w)
	}
}

// networkColumn is a network in the list's NETWORKS column: name=CIDR and,
// with DHCP, its ranges in brackets (start-end, ";" between ranges).
func networkColumn(n apitype.Network) string {
	s := n.Name + "=" + n.CIDR
	if len(n.DHCPRanges) == 0 {
		return s
	}
	var rs []string
	for _, r := range n.DHCPRanges {
		rs = append(rs, r.Start+"-"+r.End)
	}
	return s + "[" + strings.Join(rs, ";") + "]"
}
