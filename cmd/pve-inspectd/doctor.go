package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/doctor"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// minProxmoxMajor is the oldest Proxmox VE major version the daemon
// supports (DESIGN.md: Proxmox VE 9).
const minProxmoxMajor = 9

// newDoctorCmd returns `doctor`: the read-only checks, and with --canary a
// real sandbox end to end. The checks live in package doctor; this wires
// the configuration, the Proxmox token client, the sandbox API client, the
// unit's settings, the guard and the lockdown in.
func newDoctorCmd(g *globals) *cobra.Command {
	var (
		af                 apiFlags
		asJSON, canary     bool
		template, unitName string
		unitFile, ctTmpl   string
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "check that this node can run sandboxes (Proxmox, token privileges, storages, SDN, templates, unit, guard, conntrack bound, lockdown); --canary drives a real sandbox end to end; exit 0 only when every check passes",
		Long: "Read-only checks first: the Proxmox version; the token's effective privileges (GET /access/permissions) against every call the daemon makes, and no broad privilege beyond them; " +
			"the storages of the templates and the transfer storage (images, active, in the pool); SDN (no pending edits of others) and dnsmasq; the pve IPAM; " +
			"each template (hardened, disk hotplug, guest agent); the unit's sandbox against the transfer storage's path; the guard; [guard] node_conn_limit below the node's nf_conntrack_max; conntrack accounting on (nf_conntrack_acct, for the egress record's flows); the lockdown. " +
			"With --canary, through the running daemon's API: create a sandbox, exec, a file both ways on the streaming and on the disk path, snapshot and rollback, " +
			"the containment check, delete, and nothing left on Proxmox; each step timed. With [api] containers on, the same for a sandbox of one container " +
			"(create, exec, a file both ways, snapshot and rollback, delete, nothing left), each row named \"canary (container): ...\"; with containers off, one row says so. " +
			"Every failure says what to change. Exit 0 only when no check fails.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), af.timeout)
			defer cancel()
			rep := runDoctor(ctx, g, &af, cfg, doctorOptions{canary: canary, template: template, ctTemplate: ctTmpl, unitName: unitName, unitFile: unitFile})
			if asJSON {
				err = rep.WriteJSON(cmd.OutOrStdout())
			} else {
				err = rep.WriteText(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if n := len(rep.Failed()); n > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("doctor: %d check(s) failed", n)}
			}
			return nil
		},
	}
	af.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().BoolVar(&canary, "canary", false, "also create a sandbox through the daemon's API and drive it end to end (needs the daemon running)")
	cmd.Flags().StringVar(&template, "template", "", "template of the canary (default: [mcp] default_template, else the first of [api] templates)")
	cmd.Flags().StringVar(&ctTmpl, "ct-template", "", "container template of the container canary, with [api] containers on (default: the first, by name, of the node's container templates the token sees)")
	cmd.Flags().StringVar(&unitName, "unit", "pve-inspectd.service", "systemd unit whose sandbox is checked (systemctl show)")
	cmd.Flags().StringVar(&unitFile, "unit-file", "", "read the unit's settings from this file when systemd does not have the unit loaded")
	return cmd
}

type doctorOptions struct {
	canary               bool
	template, ctTemplate string
	unitName, unitFile   string
}

// runDoctor builds the checks from the configuration and runs them.
func runDoctor(ctx context.Context, g *globals, af *apiFlags, cfg config.Config, o doctorOptions) doctor.Report {
	n := doctor.Node{Name: proxmoxOptions(cfg).Node, Pool: cfg.API.Pool, TokenID: tokenID(cfg), Templates: cfg.API.Templates,
		TransferStorage: cfg.API.DiskTransferStorage, RequireHardened: cfg.API.RequireHardenedTemplates, MinMajor: minProxmoxMajor,
		SharedVNets: cfg.API.SharedVNets}
	var checks []doctor.Check
	px, tokErr := tokenClient(cfg)
	if tokErr != nil {
		// Without the token no Proxmox check can run; the node's own
		// (guard, lockdown) still do.
		checks = append(checks, doctor.Check{Name: "proxmox token", Run: func(context.Context) doctor.Outcome {
			return doctor.Outcome{Status: doctor.Fail, Detail: tokErr.Error(),
				Fix: "run pve-access-setup (it writes the token secret), and check [api.proxmox] token_id, secret_file and url"}
		}})
	} else {
		checks = append(checks,
			doctor.VersionCheck(px, n),
			doctor.PrivilegeCheck(px, n, access.Calls()),
			doctor.ScopeCheck(px, n, access.Calls()),
			doctor.PoolNICCheck(px, n),
			doctor.StorageCheck(px, n),
			doctor.TransferStorageCheck(px, n),
			doctor.NodeCheck(px, n),
			doctor.SDNCheck(px, lookDnsmasq),
			doctor.SDNLockCheck(""),
			doctor.NetworkCheck(px, n),
			doctor.IPAMCheck(px))
		checks = append(checks, doctor.TemplateChecks(px, n)...)
		checks = append(checks, doctor.UnitCheck(px, n, doctor.SystemdUnit(runHost, o.unitName, o.unitFile)))
	}
	checks = append(checks, guardCheck(cfg), conntrackCheck(cfg), conntrackAcctCheck(cfg), lockdownCheck(cfg))
	rep := doctor.Run(ctx, checks)
	if !o.canary || px == nil {
		return rep
	}
	c, err := af.client(g)
	if err != nil {
		rep.Merge(doctor.Run(ctx, []doctor.Check{{Name: "sandbox api", Run: func(context.Context) doctor.Outcome {
			return doctor.Outcome{Status: doctor.Fail, Detail: err.Error(), Fix: "give --socket, or --addr with $PVE_INSPECT_TOKEN"}
		}}}))
		return rep
	}
	api := doctor.Run(ctx, []doctor.Check{doctor.DaemonCheck(func(ctx context.Context) error {
		_, err := c.Health(ctx)
		return err
	})})
	rep.Merge(api)
	if !api.Pass {
		return rep
	}
	co := doctor.CanaryOptions{Template: canaryTemplate(cfg, o.template), Containers: cfg.API.Containers, CTTemplate: o.ctTemplate}
	if cfg.API.DiskTransferStorage != "" {
		co.DiskBytes = cfg.API.DiskTransferThreshold
	}
	rep.Merge(doctor.Canary(ctx, c, px, n, co))
	rep.Merge(doctor.ContainerCanary(ctx, c, px, n, co))
	return rep
}

// canaryTemplate picks the canary's template.
func canaryTemplate(cfg config.Config, flag string) string {
	switch {
	case flag != "":
		return flag
	case cfg.MCP.DefaultTemplate != "":
		return cfg.MCP.DefaultTemplate
	}
	names := make([]string, 0, len(cfg.API.Templates))
	for k := range cfg.API.Templates {
		names = append(names, k)
	}
	slices.Sort(names)
	if len(names) > 0 {
		return names[0]
	}
	return "debian"
}

// lookDnsmasq finds the dnsmasq binary pve-network's DHCP runs, and
// refuses a running distribution dnsmasq.service: pve-network starts one
// dnsmasq@ZONE per zone and the distribution's, listening on every
// interface, takes their port 53 (Proxmox's SDN documentation: install
// dnsmasq and disable its default instance).
func lookDnsmasq() (string, error) {
	p, err := exec.LookPath("dnsmasq")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/dnsmasq"); serr != nil {
			return "", fmt.Errorf("not in PATH nor at /usr/sbin/dnsmasq: %w", serr)
		}
		p = "/usr/sbin/dnsmasq"
	}
	if exec.Command("systemctl", "is-active", "--quiet", "dnsmasq.service").Run() == nil {
		return "", fmt.Errorf("the distribution's dnsmasq.service runs beside the SDN's dnsmasq@ZONE instances")
	}
	return p, nil
}

// runHost runs a command on this host and returns its standard output.
func runHost(ctx context.Context, argv ...string) ([]byte, error) {
	return exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
}

// guardCheck wants the guard table in force, held by the daemon, with no
// difference from the desired ruleset (what `pve-inspectd status` shows).
func guardCheck(cfg config.Config) doctor.Check {
	return doctor.Check{Name: "guard", Run: func(ctx context.Context) doctor.Outcome {
		fc, opts, err := daemon.InspectConfig(cfg)
		if err != nil {
			return doctor.Outcome{Status: doctor.Fail, Detail: err.Error(), Fix: "fix the configuration or the egress state file it names"}
		}
		st, err := firewall.Inspect(ctx, fc, opts...)
		if err != nil {
			return doctor.Outcome{Status: doctor.Fail, Detail: fmt.Sprintf("inspect guard: %v", err), Fix: "run doctor as root, in the node's network namespace"}
		}
		if !st.Present {
			return doctor.Outcome{Status: doctor.Fail, Detail: "table inet " + firewall.TableName + " absent: nothing guards the node",
				Fix: "start the daemon (systemctl start pve-inspectd); pve-inspectd status shows what is in force"}
		}
		var drifts []string
		for _, d := range append(slices.Clone(st.Drifts), st.Bridge.Drifts...) {
			drifts = append(drifts, d.String())
		}
		if len(drifts) > 0 {
			return doctor.Outcome{Status: doctor.Fail, Detail: fmt.Sprintf("%d difference(s) from the desired guard: %s", len(drifts), strings.Join(drifts, "; ")),
				Fix: "restart the daemon (systemctl restart pve-inspectd) and read its log; pve-inspectd status lists the differences"}
		}
		return doctor.Outcome{Status: doctor.Pass, Detail: fmt.Sprintf("table inet %s in force, owned by port %d", firewall.TableName, st.Owner)}
	}}
}

// conntrackCheck wants [guard] node_conn_limit below the node's
// nf_conntrack_max: otherwise guests fill the conntrack table before the
// guard's node-wide bound drops anything.
func conntrackCheck(cfg config.Config) doctor.Check {
	return doctor.Check{Name: "conntrack bound", Run: func(context.Context) doctor.Outcome {
		gc := daemon.GuardConfig(cfg.Guard)
		err := firewall.CheckNodeConnLimit(gc.ProcRoot, gc.Flood)
		switch {
		case errors.Is(err, firewall.ErrNodeConnLimit):
			return doctor.Outcome{Status: doctor.Fail, Detail: err.Error(),
				Fix: "lower [guard] node_conn_limit, or raise nf_conntrack_max in the host firewall options (pvesh set /nodes/<node>/firewall/options --nf_conntrack_max N)"}
		case errors.Is(err, os.ErrNotExist):
			return doctor.Outcome{Status: doctor.Skip, Detail: "nf_conntrack is not loaded: no conntrack table to fill yet"}
		case err != nil:
			return doctor.Outcome{Status: doctor.Fail, Detail: err.Error(), Fix: "run doctor as root on the node"}
		}
		return doctor.Outcome{Status: doctor.Pass, Detail: fmt.Sprintf("node_conn_limit %d is below nf_conntrack_max", gc.Flood.NodeConnLimit)}
	}}
}

// conntrackAcctCheck wants conntrack's accounting on in the node's
// namespace (net.netfilter.nf_conntrack_acct=1, which the guard sets at
// start): the egress record's flows take their bytes and packets from
// it.
func conntrackAcctCheck(cfg config.Config) doctor.Check {
	return doctor.Check{Name: "conntrack accounting", Run: func(context.Context) doctor.Outcome {
		p := filepath.Join(daemon.GuardConfig(cfg.Guard).ProcRoot, "sys/net/netfilter/nf_conntrack_acct")
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return doctor.Outcome{Status: doctor.Skip, Detail: "nf_conntrack is not loaded: no flows to count yet"}
		case err != nil:
			return doctor.Outcome{Status: doctor.Fail, Detail: err.Error(), Fix: "run doctor as root on the node"}
		case strings.TrimSpace(string(b)) != "1":
			return doctor.Outcome{Status: doctor.Fail, Detail: "net.netfilter.nf_conntrack_acct is off: the egress record's flows have no byte or packet counts",
				Fix: "restart the daemon (its guard sets it at start), or sysctl -w net.netfilter.nf_conntrack_acct=1 (flows begun before keep no counts)"}
		}
		return doctor.Outcome{Status: doctor.Pass, Detail: "conntrack counts each flow's bytes and packets (the egress record's flows)"}
	}}
}

// lockdownCheck wants the daemon's lockdown state current and converged
// with the marker (what `pve-inspectd lockdown status` shows).
func lockdownCheck(cfg config.Config) doctor.Check {
	return doctor.Check{Name: "lockdown", Run: func(context.Context) doctor.Outcome {
		r := lockdownReport(cfg.Lockdown, time.Now())
		if !r.OK {
			fix := "start the daemon (systemctl start pve-inspectd) and read its log; pve-inspectd lockdown status shows the state"
			if r.Daemon == "running" {
				fix = "wait one re-assert interval and run doctor again; if it stays, read the daemon's log (pve-inspectd lockdown status)"
			}
			return doctor.Outcome{Status: doctor.Fail, Detail: fmt.Sprintf("daemon %s: %s", r.Daemon, r.Why), Fix: fix}
		}
		return doctor.Outcome{Status: doctor.Pass, Detail: r.Why}
	}}
}
