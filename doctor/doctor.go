// Package doctor checks that a node can run pve-inspectd's sandboxes: the
// read-only checks an operator runs after install (Proxmox version, the
// token's privileges against every call the daemon makes, storages, SDN,
// IPAM, templates, the unit's sandbox against the transfer storage, the
// guard and the lockdown) and the canary, a real sandbox driven end to end
// through the sandbox API. Every failure says what to change.
//
// The package knows Proxmox and the sandbox API only through the small
// interfaces it declares (API, SandboxAPI); cmd/pve-inspectd wires the
// daemon's clients and configuration in.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is a check's outcome.
type Status string

const (
	// Pass: the check found what the daemon needs.
	Pass Status = "pass"
	// Fail: the check found something that breaks the daemon; Fix says
	// what to change.
	Fail Status = "fail"
	// Skip: the check does not apply here (Detail says why); a skip never
	// fails the run.
	Skip Status = "skip"
	// Warn: the daemon works, but something is broader or weaker than it
	// should be; Fix says what to change. A warning never fails the run.
	Warn Status = "warn"
)

// Result is one row of the report.
type Result struct {
	// Name identifies the check ("privileges", "canary: create", ...).
	Name string `json:"name"`
	// Status is pass, fail, warn or skip.
	Status Status `json:"status"`
	// Detail is what the check saw.
	Detail string `json:"detail,omitempty"`
	// Fix is what to change when Status is fail or warn.
	Fix string `json:"fix,omitempty"`
	// Duration is how long the check took.
	Duration time.Duration `json:"-"`
	// Millis is Duration in milliseconds (the JSON form).
	Millis int64 `json:"duration_ms"`
}

// Report is every result of one run.
type Report struct {
	// Checks are the read-only checks, then the canary's steps.
	Checks []Result `json:"checks"`
	// Pass is true when no check failed.
	Pass bool `json:"pass"`
}

// Failed returns the failed results.
func (r Report) Failed() []Result { return r.with(Fail) }

// Warnings returns the results that warn.
func (r Report) Warnings() []Result { return r.with(Warn) }

func (r Report) with(st Status) []Result {
	var out []Result
	for _, c := range r.Checks {
		if c.Status == st {
			out = append(out, c)
		}
	}
	return out
}

// Check is one named check. Run returns the outcome; the runner times it.
type Check struct {
	// Name is the row's name in the report.
	Name string
	// Run does the check; it must not panic and reports every problem
	// as an Outcome.
	Run func(ctx context.Context) Outcome
}

// Outcome is what a check returns.
type Outcome struct {
	// Status is pass, fail, warn or skip.
	Status Status
	// Detail is what the check saw.
	Detail string
	// Fix is what to change (set when Status is fail or warn).
	Fix string
}

// passf, failf, warnf and skipf build outcomes.
func passf(format string, a ...any) Outcome {
	return Outcome{Status: Pass, Detail: fmt.Sprintf(format, a...)}
}

func failf(fix, format string, a ...any) Outcome {
	return Outcome{Status: Fail, Detail: fmt.Sprintf(format, a...), Fix: fix}
}

func warnf(fix, format string, a ...any) Outcome {
	return Outcome{Status: Warn, Detail: fmt.Sprintf(format, a...), Fix: fix}
}

func skipf(format string, a ...any) Outcome {
	return Outcome{Status: Skip, Detail: fmt.Sprintf(format, a...)}
}

// Run runs the checks in order, timing each, and returns the report.
func Run(ctx context.Context, checks []Check) Report {
	rep := Report{Pass: true}
	for _, c := range checks {
		o, d := timed(func() Outcome { return c.Run(ctx) })
		rep.add(c.Name, o, d)
	}
	return rep
}

// add appends a result.
func (r *Report) add(name string, o Outcome, d time.Duration) {
	r.Checks = append(r.Checks, Result{Name: name, Status: o.Status, Detail: o.Detail, Fix: o.Fix, Duration: d, Millis: d.Milliseconds()})
	if o.Status == Fail {
		r.Pass = false
	}
}

// Merge appends other's results (the canary after the read-only checks).
func (r *Report) Merge(other Report) {
	r.Checks = append(r.Checks, other.Checks...)
	r.Pass = r.Pass && other.Pass
}

func timed(f func() Outcome) (Outcome, time.Duration) {
	t0 := time.Now()
	o := f()
	return o, time.Since(t0)
}

// WriteText prints the report as a table, then every failure's and
// warning's fix.
func (r Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tTIME\tDETAIL")
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Name, strings.ToUpper(string(c.Status)), c.Duration.Round(time.Millisecond), oneLine(c.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	failed, warned := r.Failed(), r.Warnings()
	for _, c := range failed {
		fmt.Fprintf(w, "\n%s FAILED: %s\n  change: %s\n", c.Name, c.Detail, c.Fix)
	}
	for _, c := range warned {
		fmt.Fprintf(w, "\n%s WARNING: %s\n  change: %s\n", c.Name, c.Detail, c.Fix)
	}
	if len(failed) == 0 {
		msg := "\nall checks pass"
		if len(warned) > 0 {
			msg += fmt.Sprintf(", %d with a warning", len(warned))
		}
		_, err := fmt.Fprintln(w, msg)
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d check(s) failed\n", len(failed))
	return err
}

// WriteJSON prints the report as indented JSON.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", "; ")
	if len(s) > 160 {
		return s[:157] + "..."
	}
	return s
}
