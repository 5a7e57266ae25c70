package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// vmConfigs is what the template verbs need of the Proxmox client.
type vmConfigs interface {
	VMConfig(ctx context.Context, vmid int) (map[string]string, error)
	UpdateVMConfig(ctx context.Context, vmid int, set map[string]string, del []string) error
}

// newTemplateCmd returns `template check VMID`, `template harden VMID`
// and `template build NAME`.
func newTemplateCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "template", Short: "build a sandbox template, or check or harden one against the hardened VM profile", Args: cobra.NoArgs}
	var asJSON bool
	check := &cobra.Command{
		Use:   "check VMID",
		Short: "report every item of the hardened VM profile for a template; exit 1 when a create would refuse it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vmid, err := parseVMID(args[0])
			if err != nil {
				return err
			}
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			px, err := tokenClient(cfg)
			if err != nil {
				return err
			}
			rep, err := templateReport(cmd.Context(), px, vmid)
			if err != nil {
				return err
			}
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				writeReport(cmd.OutOrStdout(), vmid, rep)
			}
			if n := len(rep.TemplateFailures()); n > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("template %d: %d item(s) a clone cannot fix", vmid, n)}
			}
			return nil
		},
	}
	check.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	var user, passwordFile string
	harden := &cobra.Command{
		Use:   "harden VMID",
		Short: "set the hardened VM profile on a template, root-only items included (run once as root; logs in as --user)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vmid, err := parseVMID(args[0])
			if err != nil {
				return err
			}
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			pw, err := readPassword(passwordFile, cmd.InOrStdin())
			if err != nil {
				return err
			}
			px, err := pveapi.NewWithPassword(proxmoxOptions(cfg), user, pw)
			if err != nil {
				return err
			}
			return hardenTemplate(cmd.Context(), cmd.OutOrStdout(), px, vmid)
		},
	}
	harden.Flags().StringVar(&user, "user", "root@pam", "Proxmox user to log in as (root@pam: the token cannot set root-only keys)")
	harden.Flags().StringVar(&passwordFile, "password-file", "", "file holding the user's password (\"-\" or empty: read one line from stdin)")
	c.AddCommand(check, harden, newTemplateBuildCmd(g))
	return c
}

func parseVMID(s string) (int, error) {
	v, err := strconv.Atoi(s)
	if err != nil || v < 100 || v > 999999999 {
		return 0, fmt.Errorf("VMID %q: want a number 100-999999999", s)
	}
	return v, nil
}

func proxmoxOptions(cfg config.Config) pveapi.Options {
	return pveapi.Options{URL: cfg.API.Proxmox.URL, Node: daemon.ProxmoxNode(cfg), RootCAFile: cfg.API.Proxmox.CAFile}
}

// tokenClient is the daemon's pool-scoped token client ([api.proxmox]).
func tokenClient(cfg config.Config) (*pveapi.Client, error) {
	o := proxmoxOptions(cfg)
	var err error
	o.TokenID, o.Secret, err = daemon.ReadToken(cfg.API.Proxmox.SecretFile, cfg.API.Proxmox.TokenID, o.Node)
	if err != nil {
		return nil, err
	}
	return pveapi.New(o)
}

// tokenID is the daemon's token id as the doctor names it in its fixes:
// the one tokenClient uses, or what the configuration says when the
// secret cannot be read.
func tokenID(cfg config.Config) string {
	id, _, err := daemon.ReadToken(cfg.API.Proxmox.SecretFile, cfg.API.Proxmox.TokenID, daemon.ProxmoxNode(cfg))
	if err != nil {
		if id = cfg.API.Proxmox.TokenID; id == "" {
			id = access.TokenID(daemon.ProxmoxNode(cfg))
		}
	}
	return id
}

func readPassword(path string, stdin io.Reader) (string, error) {
	var b []byte
	var err error
	if path == "" || path == "-" {
		line, rerr := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
		if rerr != nil && rerr != io.EOF {
			return "", fmt.Errorf("read password: %w", rerr)
		}
		b = []byte(line)
	} else if b, err = os.ReadFile(path); err != nil {
		return "", fmt.Errorf("read password: %w", err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("read password: empty")
	}
	return pw, nil
}

func templateReport(ctx context.Context, px vmConfigs, vmid int) (hardening.Report, error) {
	conf, err := px.VMConfig(ctx, vmid)
	if err != nil {
		return hardening.Report{}, fmt.Errorf("read config of %d: %w", vmid, err)
	}
	if conf["template"] != "1" {
		return hardening.Report{}, fmt.Errorf("vm %d is not a template", vmid)
	}
	return hardening.CheckTemplate(conf), nil
}

func writeReport(w io.Writer, vmid int, rep hardening.Report) {
	fmt.Fprintf(w, "template %d, hardened VM profile:\n", vmid)
	for _, it := range rep.Items {
		state := "ok  "
		if !it.OK {
			state = "FAIL"
		}
		fix := ""
		if !it.OK {
			fix = map[hardening.Fixer]string{hardening.FixClone: "  [set on every clone]",
				hardening.FixTemplate: "  [on the template: pve-inspectd template harden, as root]",
				hardening.FixRebuild:  "  [rebuild the template]"}[it.Fix]
		}
		fmt.Fprintf(w, "  %s %-44s want %-40s got %s%s\n", state, it.Name, it.Want, orAbsent(it.Got), fix)
	}
	switch f := rep.TemplateFailures(); {
	case len(f) == 0 && rep.UEFI:
		fmt.Fprintf(w, "hardened for UEFI (bios ovmf): creates asking firmware uefi may clone it where [api] allow_uefi is on (clones get the remaining items); others refuse it\n")
	case len(f) == 0:
		fmt.Fprintf(w, "hardened: creates may clone it (clones get the remaining items)\n")
	default:
		fmt.Fprintf(w, "NOT hardened: %d item(s) a clone cannot fix; creates refuse it\n", len(f))
	}
}

func orAbsent(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}

// hardenTemplate applies the template changes in one request and checks
// the result.
func hardenTemplate(ctx context.Context, w io.Writer, px vmConfigs, vmid int) error {
	if _, err := templateReport(ctx, px, vmid); err != nil {
		return err
	}
	conf, err := px.VMConfig(ctx, vmid)
	if err != nil {
		return err
	}
	set, del := hardening.TemplateChanges(conf)
	if len(set) > 0 || len(del) > 0 {
		if err := px.UpdateVMConfig(ctx, vmid, set, del); err != nil {
			return fmt.Errorf("harden template %d: %w", vmid, err)
		}
	}
	for _, k := range del {
		fmt.Fprintf(w, "deleted %s\n", k)
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		fmt.Fprintf(w, "set %s = %s\n", k, set[k])
	}
	if _, ok := set["scsihw"]; ok {
		fmt.Fprintf(w, "note: the template's disks are now on virtio-scsi: its guest needs the virtio-scsi driver to boot (Linux: virtio_scsi in its initramfs; Windows: vioscsi); boot a clone once before creates use it\n")
	}
	after, err := templateReport(ctx, px, vmid)
	if err != nil {
		return err
	}
	writeReport(w, vmid, after)
	if n := len(after.Failed()); n > 0 {
		return &exitError{code: 1, msg: fmt.Sprintf("template %d: %d item(s) still fail", vmid, n)}
	}
	return nil
}
