package provision

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Outcome is how an Apply run ended without error.
type Outcome int

const (
	// Completed means every step is done.
	Completed Outcome = iota
	// Rebooting means a reboot was started; the resume unit continues.
	Rebooting
)

// StepError is a failed step: its output and the command that resumes.
type StepError struct {
	ID     string
	Output string
	Resume string
	Err    error
}

func (e *StepError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %s failed: %v", e.ID, e.Err)
	if e.Output != "" {
		fmt.Fprintf(&b, "\n--- output of step %s ---\n%s\n---", e.ID, e.Output)
	}
	fmt.Fprintf(&b, "\nfix the cause, then resume with: %s", e.Resume)
	return b.String()
}

func (e *StepError) Unwrap() error { return e.Err }

// LockProbe tells whether a file is locked by another process (dpkg uses
// fcntl locks).
type LockProbe interface {
	Held(path string) (bool, error)
}

// FcntlProbe tests a file's fcntl write lock without taking it.
type FcntlProbe struct{}

// Held implements LockProbe. A missing file is not locked.
func (FcntlProbe) Held(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

// Engine runs a recipe.
type Engine struct {
	Env   *Env
	Steps []Step
	// ResumeArgv is the command that resumes apply; it is written into the
	// oneshot unit and printed when a step fails.
	ResumeArgv []string
	// Locks probes the dpkg lock; nil = FcntlProbe.
	Locks LockProbe
	// LockWait bounds the wait for dpkg before a reboot (default 30 min).
	LockWait time.Duration
	// Poll is the interval between dpkg checks (default 5 s).
	Poll time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Report, when set, is told about progress: the step being applied and
	// "running", "rebooting", "failed" or "done" (step "" when complete).
	// A reporting error is logged and never stops the recipe.
	Report func(ctx context.Context, step, status string) error
}

func (e *Engine) report(ctx context.Context, step, status string) {
	if e.Report == nil {
		return
	}
	if err := e.Report(ctx, step, status); err != nil {
		e.Env.Log.Warn("progress report failed", "step", step, "status", status, "err", err)
	}
}

// PlanItem is one line of a plan.
type PlanItem struct {
	ID          string `json:"id"`
	Description string `json:"description"`
	// Action is "none" (done), "apply", or "skip" (configured to skip).
	Action string `json:"action"`
	// Note says why an "apply" could not be checked, e.g. "after
	// proxmox-ve: will apply" when the check's tool is not installed yet.
	Note   string `json:"note,omitempty"`
	Reboot bool   `json:"reboot_after"`
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Engine) skipped(id string) bool { return slices.Contains(e.Env.Config.Skip, id) }

func (e *Engine) done(ctx context.Context, s Step) (bool, error) {
	if s.Check == nil {
		return e.Env.State.Steps[s.ID].Status == StatusDone, nil
	}
	ok, err := s.Check(ctx, e.Env)
	if err != nil {
		return false, fmt.Errorf("check %s: %w", s.ID, err)
	}
	return ok, nil
}

// Plan runs only the checks and says what Apply would do. It changes
// nothing.
func (e *Engine) Plan(ctx context.Context) ([]PlanItem, error) {
	if err := e.load(); err != nil {
		return nil, err
	}
	var out []PlanItem
	for _, s := range e.Steps {
		it := PlanItem{ID: s.ID, Description: s.Description, Reboot: s.Reboot, Action: "apply"}
		switch {
		case e.skipped(s.ID):
			it.Action = "skip"
		default:
			ok, err := e.done(ctx, s)
			switch {
			case errors.Is(err, exec.ErrNotFound):
				// A tool an earlier step installs: not done yet, surely.
				it.Note = "check's tool not installed yet: will apply"
				if s.After != "" {
					it.Note = "after " + s.After + ": will apply"
				}
			case err != nil:
				return nil, err
			case ok:
				it.Action = "none"
			}
		}
		out = append(out, it)
	}
	return out, nil
}

func (e *Engine) load() error {
	if e.Env.State != nil {
		return nil
	}
	st, err := LoadState(e.Env.Root)
	if err != nil {
		return err
	}
	e.Env.State = st
	return nil
}

// Resume is the resume command as one shell-quotable line.
func (e *Engine) Resume() string {
	q := make([]string, len(e.ResumeArgv))
	for i, a := range e.ResumeArgv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// Apply runs the recipe until it completes, a step fails (*StepError), or a
// reboot starts (Rebooting).
func (e *Engine) Apply(ctx context.Context) (Outcome, error) {
	unlock, err := e.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	if err := e.load(); err != nil {
		return 0, err
	}
	st := e.Env.State
	boot, err := BootID(e.Env.Root)
	if err != nil {
		return 0, err
	}
	log := e.Env.Log
	if st.Reboot != nil {
		if st.Reboot.BootID == boot {
			// The reboot was asked for but this is still the same boot.
			log.Info("reboot requested earlier has not happened; rebooting", "after_step", st.Reboot.AfterStep)
			return Rebooting, e.reboot(ctx, st.Reboot.AfterStep, boot)
		}
		log.Info("resumed after reboot", "after_step", st.Reboot.AfterStep)
		st.Reboot = nil
		st.BootID = boot
		if err := st.Save(e.Env.Root); err != nil {
			return 0, err
		}
	}
	for _, s := range e.Steps {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if e.skipped(s.ID) {
			continue
		}
		ok, err := e.done(ctx, s)
		if err != nil {
			return 0, e.fail(s.ID, boot, err)
		}
		if ok {
			if st.Steps[s.ID].Status != StatusDone {
				st.Steps[s.ID] = StepState{Status: StatusDone, At: e.now(), BootID: boot}
				st.BootID = boot
				if err := st.Save(e.Env.Root); err != nil {
					return 0, err
				}
			}
			continue
		}
		log.Info("applying step", "step", s.ID)
		e.report(ctx, s.ID, "running")
		if err := s.Apply(ctx, e.Env); err != nil {
			return 0, e.fail(s.ID, boot, err)
		}
		if s.Check != nil {
			ok, err := e.done(ctx, s)
			if err != nil {
				return 0, e.fail(s.ID, boot, err)
			}
			if !ok {
				return 0, e.fail(s.ID, boot, errors.New("applied, but its check still says not done"))
			}
		}
		st.Steps[s.ID] = StepState{Status: StatusDone, At: e.now(), BootID: boot, Applied: true}
		st.BootID = boot
		if err := st.Save(e.Env.Root); err != nil {
			return 0, err
		}
		if s.Reboot {
			return Rebooting, e.reboot(ctx, s.ID, boot)
		}
	}
	if e.Env.Root.Exists(ResumeUnitAt) {
		if err := e.removeUnit(ctx); err != nil {
			return 0, err
		}
	}
	if st.Completed.IsZero() {
		e.report(ctx, "", "done")
		st.Completed = e.now()
		st.BootID = boot
		if err := st.Save(e.Env.Root); err != nil {
			return 0, err
		}
	}
	return Completed, nil
}

// ErrBusy means another apply holds the lock.
var ErrBusy = errors.New("another pve-bootstrap apply is running")

// lock takes /var/lib/pve-bootstrap/apply.lock so two applies (the resume
// unit and an operator, say) never run at once.
func (e *Engine) lock() (func(), error) {
	p := e.Env.Root.Path(applyLock)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, fmt.Errorf("apply lock: %w", err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("apply lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrBusy
		}
		return nil, fmt.Errorf("apply lock: %w", err)
	}
	return func() { f.Close() }, nil
}

func (e *Engine) fail(id, boot string, err error) error {
	out := ""
	var ee *ExitError
	if errors.As(err, &ee) {
		out = ee.Result.Output()
	}
	e.report(context.Background(), id, "failed")
	st := e.Env.State
	st.Steps[id] = StepState{Status: StatusFailed, At: e.now(), BootID: boot, Output: out}
	st.BootID = boot
	serr := &StepError{ID: id, Output: out, Resume: e.Resume(), Err: err}
	if saveErr := st.Save(e.Env.Root); saveErr != nil {
		return errors.Join(serr, saveErr)
	}
	return serr
}

// reboot records the request, waits for dpkg, installs the resume unit and
// reboots. The request is recorded first, so an apply after a failed wait
// asks for the reboot again instead of carrying on without it.
func (e *Engine) reboot(ctx context.Context, after, boot string) error {
	st := e.Env.State
	if st.Reboot == nil || st.Reboot.BootID != boot {
		st.Reboot = &RebootState{AfterStep: after, BootID: boot, At: e.now()}
		if err := st.Save(e.Env.Root); err != nil {
			return err
		}
	}
	e.report(ctx, after, "rebooting")
	if err := e.waitDpkg(ctx); err != nil {
		return fmt.Errorf("reboot after step %s: %w\nresume with: %s", after, err, e.Resume())
	}
	if err := e.installUnit(ctx); err != nil {
		return fmt.Errorf("reboot after step %s: %w\nresume with: %s", after, err, e.Resume())
	}
	e.Env.Log.Info("rebooting; the resume unit continues after boot", "after_step", after, "unit", ResumeUnit)
	if _, err := run(ctx, e.Env.Runner, "systemctl", "reboot"); err != nil {
		return fmt.Errorf("reboot after step %s: %w\nresume with: %s", after, err, e.Resume())
	}
	return nil
}

// waitDpkg waits until no process holds the dpkg locks and `dpkg --audit`
// reports nothing.
func (e *Engine) waitDpkg(ctx context.Context) error {
	probe := e.Locks
	if probe == nil {
		probe = FcntlProbe{}
	}
	wait, poll := e.LockWait, e.Poll
	if wait == 0 {
		wait = 30 * time.Minute
	}
	if poll == 0 {
		poll = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var last string
	for {
		held := false
		for _, p := range []string{dpkgLockPath, dpkgDBLock} {
			h, err := probe.Held(e.Env.Root.Path(p))
			if err != nil {
				return fmt.Errorf("probe %s: %w", p, err)
			}
			if h {
				held, last = true, p+" is locked"
			}
		}
		if !held {
			res, err := run(ctx, e.Env.Runner, "dpkg", "--audit")
			switch {
			case err == nil && len(strings.TrimSpace(res.Output())) == 0:
				return nil
			case err != nil && ctx.Err() == nil:
				last = "dpkg --audit: " + err.Error()
			default:
				last = "dpkg --audit reports: " + res.Output()
			}
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dpkg not idle and clean after %s: %s", wait, last)
		case <-t.C:
		}
	}
}

// UnitFile renders the oneshot resume unit for argv.
func UnitFile(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		a = strings.NewReplacer(`\`, `\\`, `"`, `\"`, `%`, `%%`, `$`, `$$`).Replace(a)
		q[i] = `"` + a + `"`
	}
	return `# Written by pve-bootstrap; removed when the recipe completes.
[Unit]
Description=Resume pve-bootstrap after a reboot
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
TimeoutStartSec=infinity
ExecStart=` + strings.Join(q, " ") + `
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
`
}

func (e *Engine) installUnit(ctx context.Context) error {
	if err := e.Env.Root.WriteFile(ResumeUnitAt, []byte(UnitFile(e.ResumeArgv)), 0o644); err != nil {
		return err
	}
	for _, argv := range [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", ResumeUnit}} {
		if _, err := run(ctx, e.Env.Runner, argv...); err != nil {
			return fmt.Errorf("install resume unit: %w", err)
		}
	}
	return nil
}

func (e *Engine) removeUnit(ctx context.Context) error {
	if _, err := run(ctx, e.Env.Runner, "systemctl", "disable", ResumeUnit); err != nil {
		return fmt.Errorf("remove resume unit: %w", err)
	}
	if err := e.Env.Root.Remove(ResumeUnitAt); err != nil {
		return err
	}
	if _, err := run(ctx, e.Env.Runner, "systemctl", "daemon-reload"); err != nil {
		return fmt.Errorf("remove resume unit: %w", err)
	}
	return nil
}

// StatusItem is one step as recorded in state.json.
type StatusItem struct {
	ID          string    `json:"id"`
	Description string    `json:"description"`
	Status      string    `json:"status"`
	At          time.Time `json:"at,omitzero"`
	Output      string    `json:"output,omitempty"`
}

// Status reports the recorded state of each step without running checks.
func (e *Engine) Status() ([]StatusItem, *State, error) {
	if err := e.load(); err != nil {
		return nil, nil, err
	}
	var out []StatusItem
	for _, s := range e.Steps {
		ss := e.Env.State.Steps[s.ID]
		status := ss.Status
		switch {
		case e.skipped(s.ID):
			status = "skipped"
		case status == "":
			status = StatusPending
		}
		out = append(out, StatusItem{ID: s.ID, Description: s.Description, Status: status, At: ss.At, Output: ss.Output})
	}
	return out, e.Env.State, nil
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:@,+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
