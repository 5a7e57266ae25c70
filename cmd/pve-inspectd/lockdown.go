package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
)

// Exit codes of "pve-inspectd lockdown".
const (
	// exitNotConverged: the daemon has not (or cannot) put the node in the
	// state the marker asks for, or its state is unknown.
	exitNotConverged = 3
)

func newLockdownCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lockdown on|off|status|sync",
		Short: "ask for or lift the egress lockdown (the marker file), or show whether it is in force",
		Long: `lockdown on creates the marker file, lockdown off removes it; the running
daemon enforces what the marker asks for. lockdown status shows the marker,
whether the daemon has the lockdown in force, and why not. lockdown sync
waits until the daemon has the node in the state the marker asks for: the
reference runbook's "touch|rm the marker, then systemctl start
inspect-proxmox-egress-lockdown.service" runs it.

Exit codes: 0 the node is in the state the marker asks for; 3 it is not (yet),
or the daemon's state is unknown or stale; 1 any other error.`,
	}
	var wait time.Duration
	set := func(on bool) *cobra.Command {
		name, short := "off", "remove the marker file (lift the lockdown)"
		if on {
			name, short = "on", "create the marker file (ask for the lockdown)"
		}
		c := &cobra.Command{
			Use:   name,
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				cfg, err := g.loadConfig()
				if err != nil {
					return err
				}
				s := cfg.Lockdown.Effective()
				since := time.Now().UTC()
				if err := lockdown.SetMarker(s.Marker, on); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "marker %s %s\n", s.Marker, map[bool]string{true: "created", false: "removed"}[on])
				if wait <= 0 {
					return nil
				}
				return waitConverged(cmd.Context(), cmd.OutOrStdout(), s, on, since, wait)
			},
		}
		c.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the daemon to report the new state (0: do not wait)")
		return c
	}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "show the marker and whether the lockdown is in force",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			r := lockdownReport(cfg.Lockdown.Effective(), time.Now())
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(r); err != nil {
					return err
				}
			} else {
				r.write(cmd.OutOrStdout())
			}
			if !r.OK {
				return &exitError{code: exitNotConverged}
			}
			return nil
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	var syncWait time.Duration
	sync := &cobra.Command{
		Use:   "sync",
		Short: "wait until the daemon has the node in the state the marker asks for (the reference runbook's unit)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			s := cfg.Lockdown.Effective()
			on, err := lockdown.MarkerPresent(s.Marker)
			if err != nil {
				on = true // a marker that cannot be checked counts as present, as in the daemon
			}
			fmt.Fprintf(cmd.OutOrStdout(), "marker %s %s: waiting for pve-inspectd\n", s.Marker, map[bool]string{true: "present", false: "absent"}[on])
			// A state the daemon published recently enough is proof; an
			// older one is waited past (it may predate the marker change).
			return waitConverged(cmd.Context(), cmd.OutOrStdout(), s, on, time.Now().Add(-staleAfter(s)), syncWait)
		},
	}
	sync.Flags().DurationVar(&syncWait, "wait", 75*time.Second, "how long to wait for the daemon")
	cmd.AddCommand(set(true), set(false), status, sync)
	return cmd
}

// statusReport is what "lockdown status" shows.
type statusReport struct {
	Marker     bool            `json:"marker"`
	MarkerPath string          `json:"marker_path"`
	MarkerErr  string          `json:"marker_error,omitempty"`
	Daemon     string          `json:"daemon"` // running, not running, unknown
	State      *lockdown.State `json:"state,omitempty"`
	Enforced   bool            `json:"enforced"`
	OK         bool            `json:"ok"`
	Why        string          `json:"why"`
}

// lockdownReport compares the marker with the state the daemon published.
func lockdownReport(s config.LockdownSection, now time.Time) statusReport {
	r := statusReport{MarkerPath: s.Marker}
	var err error
	r.Marker, err = lockdown.MarkerPresent(s.Marker)
	if err != nil {
		r.MarkerErr = err.Error()
	}
	st, err := lockdown.ReadState(s.StateFile)
	if err != nil {
		r.Daemon = "unknown"
		r.Why = err.Error()
		return r
	}
	r.State = &st
	r.Daemon = "running"
	stale := staleAfter(s)
	switch {
	case !processAlive(st.PID):
		r.Daemon = "not running"
		r.Why = fmt.Sprintf("the daemon that wrote %s (pid %d) is not running; the state below is from %s",
			s.StateFile, st.PID, st.Updated.Format(time.RFC3339))
	case now.Sub(st.Updated) > stale:
		r.Why = fmt.Sprintf("the daemon's state is stale: last update %s ago (re-assert every %v)",
			now.Sub(st.Updated).Round(time.Second), s.ReassertInterval)
	case st.Marker != r.Marker:
		r.Why = "the daemon has not acted on the marker change yet"
	case !st.Converged:
		r.Why = st.Reason
	default:
		r.OK = true
		r.Enforced = st.Enforced
		if st.Enforced {
			r.Why = "lockdown in force: rules committed and verified, resolver blanked"
		} else {
			r.Why = "no lockdown asked for; lifted and resolver restored"
		}
	}
	return r
}

func (r statusReport) write(w io.Writer) {
	yn := map[bool]string{true: "yes", false: "no"}
	marker := "absent"
	if r.Marker {
		marker = "present"
	}
	fmt.Fprintf(w, "marker:           %s (%s)\n", marker, r.MarkerPath)
	if r.MarkerErr != "" {
		fmt.Fprintf(w, "marker error:     %s (counted as present)\n", r.MarkerErr)
	}
	fmt.Fprintf(w, "daemon:           %s\n", r.Daemon)
	fmt.Fprintf(w, "enforced:         %s\n", yn[r.Enforced])
	if st := r.State; st != nil {
		fmt.Fprintf(w, "fail closed:      %s\n", yn[st.FailClosed])
		fmt.Fprintf(w, "resolver blanked: %s\n", yn[st.ResolverBlanked])
		fmt.Fprintf(w, "management:       %s\n", strings.Join(st.Management, ", "))
		if st.Halted != "" {
			fmt.Fprintf(w, "halt asked for:   %s\n", st.Halted)
		}
		if !st.LastAssert.IsZero() {
			fmt.Fprintf(w, "last assert:      %s\n", st.LastAssert.Format(time.RFC3339))
		}
		for _, warn := range st.Warnings {
			fmt.Fprintf(w, "warning:          %s\n", warn)
		}
	}
	fmt.Fprintf(w, "status:           %s: %s\n", map[bool]string{true: "OK", false: "NOT OK"}[r.OK], r.Why)
}

// waitConverged polls the state file until the daemon reports the marker
// state on as converged by a reconcile after since.
func waitConverged(ctx context.Context, w io.Writer, s config.LockdownSection, on bool, since time.Time, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		st, err := lockdown.ReadState(s.StateFile)
		if err == nil && st.Updated.After(since) && st.Marker == on && st.Converged {
			if on {
				fmt.Fprintln(w, "lockdown in force")
			} else {
				fmt.Fprintln(w, "lockdown lifted")
			}
			return nil
		}
		select {
		case <-ctx.Done():
			why := "no state from the daemon"
			if err != nil && !errors.Is(err, lockdown.ErrNoState) {
				why = err.Error()
			} else if err == nil {
				why = st.Reason
				if why == "" {
					why = "the daemon has not acted on the marker yet"
				}
			}
			return &exitError{code: exitNotConverged, msg: fmt.Sprintf("not converged after %v: %s", wait, why)}
		case <-t.C:
		}
	}
}

// processAlive reports whether pid names a running process.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// lockdownCause is recover's cause check: the cause of a halt persists
// while the lockdown marker is present and either no interface has a
// default route, or the running daemon does not report the lockdown proven
// in force (refused commit, unverifiable table, failed DNS blanking, or no
// daemon at all).
func lockdownCause(cfg config.Config) halt.CauseCheck {
	s := cfg.Lockdown.Effective()
	route := markerRouteCause(cfg)
	return func(ctx context.Context, st halt.State) error {
		if err := route(ctx, st); err != nil {
			return err
		}
		return lockdown.InForce(s.Marker, s.StateFile, staleAfter(s), time.Now())
	}
}

// staleAfter is how old the daemon's published state may be: a few
// re-assert periods.
func staleAfter(s config.LockdownSection) time.Duration { return 3*s.ReassertInterval + 5*time.Second }
