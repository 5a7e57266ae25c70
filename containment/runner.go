package containment

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// Guest is what the runner needs from a guest agent client.
type Guest interface {
	// WriteFile creates or replaces path in the guest with r's bytes and mode.
	WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error
	// Exec runs argv in the guest with stdin, kills it after timeout, and
	// returns its (size-bounded) output and exit code.
	Exec(ctx context.Context, argv []string, stdin []byte, timeout time.Duration) (stdout, stderr []byte, exit int, err error)
}

// DefaultProbePath is where the package installs the probe binary.
const DefaultProbePath = "/usr/lib/pve-inspectd/pve-inspect-probe"

// LocateProbe returns the probe binary to upload: path, or DefaultProbePath
// when path is "". It must be a regular, static x86-64 or arm64 ELF
// executable, since it runs in a guest that may lack any libc.
func LocateProbe(path string) (string, error) {
	if path == "" {
		path = DefaultProbePath
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("locate probe: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("locate probe: %s is not a regular file", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("locate probe: %s: %w", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC {
		return "", fmt.Errorf("locate probe: %s: ELF type %v, want a static executable (build with CGO_ENABLED=0)", path, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("locate probe: %s is dynamically linked, want CGO_ENABLED=0", path)
		}
	}
	return path, nil
}

// Runner runs plans in guests.
type Runner struct {
	// ProbePath is the host path of the probe binary (see LocateProbe).
	ProbePath string
	// GuestDir is the guest directory the probe is uploaded to; "" = /tmp.
	// The probe deletes itself when it starts.
	GuestDir string
	// Concurrency is how many probes run in parallel in the guest at
	// least; 0 = the probe's default. A plan with more rows than
	// RowsPerProbe per parallel probe gets more, up to
	// probe.MaxConcurrency (see concurrency).
	Concurrency int
	// Observer watches the VM's bridge on the node while the probe runs,
	// for plans with layer-2 rows (l2observe.Observer); without one those
	// rows are errors.
	Observer Layer2Observer
	// Change, for plans with a keep-alive row (EgressSpec.KeepAlive),
	// re-applies the sandbox's egress policy once the row's first request
	// was answered: the new policy generation must cut every proxied
	// connection of the zone. The guest must be a StreamGuest.
	Change func(ctx context.Context) error
}

// ErrProbe wraps every failure to obtain a usable report from the guest:
// upload, exec, a non-zero exit, or output the strict parser rejects.
var ErrProbe = errors.New("containment probe")

// Run uploads the probe, runs the plan in the guest and judges the report.
// An error means no judgement was possible (treat it as a failed check).
// A run the probe itself could not finish (killed by the exec's timeout,
// or rows it had to cut at its own bound: a call that outlived its
// context) is run once more, and the second run's result is the answer:
// such a row is no verdict either way, and one more run costs less than
// a check failed for the probe's own sake. A row with a verdict (a leak)
// is never run again. So is a run whose only failures are missing
// connectivity (onlyUnreached): one datagram lost on a loaded node is
// not a broken sandbox, and a path that is really down fails the second
// run too, which is then the answer (a leak it shows included).
func (r *Runner) Run(ctx context.Context, g Guest, p *Plan) (*Result, error) {
	res, err := r.runOnce(ctx, g, p)
	if ctx.Err() == nil && (probeCut(res, err) || (err == nil && onlyUnreached(res))) {
		return r.runOnce(ctx, g, p)
	}
	return res, err
}

// onlyUnreached reports whether res failed and every row that did not
// pass is a path expected to work that did not answer (a positive control
// or a promised connection observed blocked), or a blocked row left
// unproven by such a failed control. A run with a leak (a row expected
// blocked that was reachable), an error or a missing row is not one.
func onlyUnreached(res *Result) bool {
	if res == nil || res.Passed() {
		return false
	}
	for _, row := range res.Rows {
		switch {
		case row.Status == Pass, row.Status == Unproven:
		case row.Expect == Reachable && row.Observed == Blocked:
		default:
			return false
		}
	}
	return true
}

// probeCut reports whether a run ended without the probe finishing its
// rows: killed by the exec's timeout, or rows cut at its own bound.
func probeCut(res *Result, err error) bool {
	if err != nil {
		return errors.Is(err, ErrProbe) && strings.Contains(err.Error(), "probe killed after")
	}
	for _, row := range res.Rows {
		if row.Observed == Errored && strings.Contains(row.Detail, probe.CutDetail) {
			return true
		}
	}
	return false
}

// runOnce is one run of Run.
func (r *Runner) runOnce(ctx context.Context, g Guest, p *Plan) (*Result, error) {
	if len(p.Checks) == 0 {
		return nil, errors.New("containment: empty plan")
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("containment: %w", err)
	}
	dir := r.GuestDir
	if dir == "" {
		dir = "/tmp"
	}
	guestPath := path.Join(dir, "pve-inspect-probe-"+hex.EncodeToString(rnd[:]))
	signal := guestPath + ".signal"
	req := p.request(r.concurrency(len(p.Checks)), signal)
	if err := probe.ValidateRequest(req); err != nil {
		return nil, fmt.Errorf("containment: %w", err)
	}
	reqJSON, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("containment: encode request: %w", err)
	}
	// The request goes as a file beside the probe, not on stdin: a probe
	// reads its request to the end before its own deadline starts, and
	// stdin ends only when the agent closes its pipe (a guest agent slow to
	// do so held the probe until the host killed it, reportless).
	reqPath := guestPath + ".json"
	if err := g.WriteFile(ctx, reqPath, bytes.NewReader(reqJSON), 0o600); err != nil {
		return nil, fmt.Errorf("%w: upload the request to %s: %w", ErrProbe, reqPath, err)
	}
	bin, err := os.Open(r.ProbePath)
	if err != nil {
		return nil, fmt.Errorf("containment: open probe: %w", err)
	}
	defer bin.Close()
	if err := g.WriteFile(ctx, guestPath, bin, 0o755); err != nil {
		return nil, fmt.Errorf("%w: upload to %s: %w", ErrProbe, guestPath, err)
	}
	var stdout, stderr []byte
	var exit int
	l2 := r.watch(ctx, p, func(ctx context.Context) error {
		argv := []string{guestPath, "-self-remove", reqPath}
		if p.keepAlive() {
			stdout, stderr, exit, err = r.execKeepAlive(ctx, g, p, argv, nil, r.execTimeout(req), signal)
			return nil
		}
		stdout, stderr, exit, err = g.Exec(ctx, argv, nil, r.execTimeout(req))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: exec: %w", ErrProbe, err)
	}
	if exit != 0 {
		return nil, fmt.Errorf("%w: exit %d: %s", ErrProbe, exit, printable(stderr, 512))
	}
	rep, err := probe.ParseReport(bytes.TrimSpace(stdout))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProbe, err)
	}
	if err := matchIDs(req, rep); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProbe, err)
	}
	return evaluate(p, rep, l2), nil
}

// RowsPerProbe is how many rows one parallel probe takes on before the
// runner adds another: a plan of blocked rows then takes about
// RowsPerProbe per-probe timeouts, until probe.MaxConcurrency is reached.
const RowsPerProbe = 8

// concurrency is the parallel probes for a plan of rows: r.Concurrency
// (or the probe's default), raised to one per RowsPerProbe rows, at most
// probe.MaxConcurrency.
func (r *Runner) concurrency(rows int) int {
	base := r.Concurrency
	if base <= 0 {
		base = probe.DefaultConcurrency
	}
	return min(max(base, (rows+RowsPerProbe-1)/RowsPerProbe), probe.MaxConcurrency)
}

// execSlack is the exec timeout's allowance for the upload's start-up, the
// facts and the report, plus a share per round of targets for scheduling.
const (
	execSlack      = 30 * time.Second
	execRoundSlack = 250 * time.Millisecond
)

// execTimeout is the time the probe run gets: probe.RunBound (every round
// of targets its full timeout, after the canary phase) plus slack. It
// grows with the rows and shrinks with the concurrency.
func (r *Runner) execTimeout(req *probe.Request) time.Duration {
	n := req.Concurrency
	if n <= 0 {
		n = probe.DefaultConcurrency
	}
	rounds := (len(req.Targets) + n - 1) / n
	return probe.RunBound(req) + execSlack + time.Duration(rounds)*execRoundSlack
}

// matchIDs requires exactly the requested ids in the report.
func matchIDs(req *probe.Request, rep *probe.Report) error {
	want := make(map[string]bool, len(req.Targets))
	for _, t := range req.Targets {
		want[t.ID] = true
	}
	for _, r := range rep.Results {
		if !want[r.ID] {
			return fmt.Errorf("report has result %q that was not asked for", r.ID)
		}
		delete(want, r.ID)
	}
	if len(want) > 0 {
		return fmt.Errorf("report lacks %d of %d results", len(want), len(req.Targets))
	}
	return nil
}

// printable returns at most n bytes of b with non-printable bytes escaped.
func printable(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c >= 0x20 && c < 0x7f {
			out = append(out, c)
		} else {
			out = append(out, fmt.Sprintf("\\x%02x", c)...)
		}
	}
	return string(out)
}
