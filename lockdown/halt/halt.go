package halt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// DefaultStateFile records an active halt.
const DefaultStateFile = "/run/pve-inspectd/halted"

// DefaultUnits returns the units a halt stops and masks: Proxmox's API
// daemons.
func DefaultUnits() []string { return []string{"pveproxy.service", "pvedaemon.service"} }

// Transport selects how the halt reaches systemd.
type Transport string

const (
	// TransportPrivate is systemd's private socket /run/systemd/private:
	// a direct connection to PID 1, root only by file permission, no
	// dbus-daemon and no polkit in the path.
	TransportPrivate Transport = "private"
	// TransportSystemBus is org.freedesktop.systemd1 on the system bus.
	TransportSystemBus Transport = "system"
	// TransportAuto tries the private socket and falls back to the system
	// bus when the private socket cannot be reached. The default.
	TransportAuto Transport = "auto"
)

// Config configures a Halter. The zero value means the defaults.
type Config struct {
	// Units are stopped and runtime-masked by a halt; DefaultUnits when nil.
	Units []string
	// StateFile records an active halt; DefaultStateFile when empty.
	StateFile string
	// Transport selects the connection to systemd; TransportAuto when empty.
	Transport Transport
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Units != nil && len(c.Units) == 0 {
		return errors.New("units: must name at least one unit")
	}
	for _, u := range c.Units {
		if !validUnit(u) {
			return fmt.Errorf("units: %q is not a unit name (want e.g. pveproxy.service)", u)
		}
	}
	if c.StateFile != "" && (!filepath.IsAbs(c.StateFile) || filepath.Clean(c.StateFile) != c.StateFile) {
		return fmt.Errorf("state_file: %q is not a clean absolute path", c.StateFile)
	}
	switch c.Transport {
	case "", TransportPrivate, TransportSystemBus, TransportAuto:
	default:
		return fmt.Errorf("transport: %q: want private, system or auto", c.Transport)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Units == nil {
		c.Units = DefaultUnits()
	}
	if c.StateFile == "" {
		c.StateFile = DefaultStateFile
	}
	if c.Transport == "" {
		c.Transport = TransportAuto
	}
	return c
}

func validUnit(u string) bool {
	if u == "" || len(u) > 255 || strings.HasPrefix(u, ".") {
		return false
	}
	for _, r := range u {
		if !(r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune(":-_.\\@", r))) {
			return false
		}
	}
	i := strings.LastIndexByte(u, '.')
	return i > 0 && i < len(u)-1
}

// systemd is the part of systemd's D-Bus API a halt uses; *dbus.Conn of
// github.com/coreos/go-systemd/v22 implements it.
type systemd interface {
	MaskUnitFilesContext(ctx context.Context, files []string, runtime, force bool) ([]sddbus.MaskUnitFileChange, error)
	UnmaskUnitFilesContext(ctx context.Context, files []string, runtime bool) ([]sddbus.UnmaskUnitFileChange, error)
	ReloadContext(ctx context.Context) error
	StopUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	StartUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	GetUnitPropertiesContext(ctx context.Context, unit string) (map[string]any, error)
	ResetFailedUnitContext(ctx context.Context, name string) error
	Close()
}

// dialer opens a connection to systemd.
type dialer func(ctx context.Context) (systemd, error)

func dialFor(t Transport) dialer {
	private := func(ctx context.Context) (systemd, error) {
		c, err := sddbus.NewSystemdConnectionContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("connect to systemd private socket: %w", err)
		}
		return c, nil
	}
	system := func(ctx context.Context) (systemd, error) {
		c, err := sddbus.NewSystemConnectionContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("connect to systemd over the system bus: %w", err)
		}
		return c, nil
	}
	switch t {
	case TransportPrivate:
		return private
	case TransportSystemBus:
		return system
	default:
		return func(ctx context.Context) (systemd, error) {
			c, perr := private(ctx)
			if perr == nil {
				return c, nil
			}
			c, serr := system(ctx)
			if serr == nil {
				return c, nil
			}
			return nil, errors.Join(perr, serr)
		}
	}
}

// State is the content of the state file: an active halt.
type State struct {
	// Reason is why the halt happened (the first reason, if several halts
	// were asked for).
	Reason string `json:"reason"`
	// Since is when the halt happened.
	Since time.Time `json:"since"`
	// Units are the units the halt stopped and masked.
	Units []string `json:"units"`
}

// ErrNotHalted is returned by Recover when no halt is recorded.
var ErrNotHalted = errors.New("halt: not halted")

// CauseError is returned by Recover when the cause check says the cause of
// the halt persists; nothing was changed.
type CauseError struct{ Err error }

func (e *CauseError) Error() string { return "halt: cause persists, not recovering: " + e.Err.Error() }
func (e *CauseError) Unwrap() error { return e.Err }

// CauseCheck reports whether the cause of a halt persists: nil when it is
// gone, an error saying what persists otherwise. st is the recorded halt.
type CauseCheck func(ctx context.Context, st State) error

// Halter performs the fail-deadly halt and the recovery. Its methods are
// safe for concurrent use.
type Halter struct {
	cfg     Config
	dial    dialer
	log     *slog.Logger
	metrics *metrics
	now     func() time.Time
	mu      sync.Mutex
}

// New returns a Halter. Metrics are registered on reg unless it is nil. The
// current state (from the state file) is reflected in the metrics at once.
func New(cfg Config, log *slog.Logger, reg Registerer) (*Halter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("halt config: %w", err)
	}
	cfg = cfg.withDefaults()
	return newHalter(cfg, dialFor(cfg.Transport), log, reg)
}

func newHalter(cfg Config, dial dialer, log *slog.Logger, reg Registerer) (*Halter, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	h := &Halter{cfg: cfg, dial: dial, log: log.With("component", "halt"), metrics: m, now: time.Now}
	st, err := h.Status()
	switch {
	case err == nil:
		m.setHalted(st.Reason)
	case errors.Is(err, ErrNotHalted):
		m.setHalted("")
	default:
		// Never let a damaged state file prevent a halt: something wrote
		// it, so report halted; Halt rewrites it.
		h.log.Error("halt state file unreadable", "path", cfg.StateFile, "error", err)
		m.setHalted(unreadableReason)
	}
	return h, nil
}

// unreadableReason is the metric's reason while the state file cannot be read.
const unreadableReason = "unknown (state file unreadable)"

// maxReason bounds the recorded reason (it is also a metric label value).
const maxReason = 200

// cleanReason makes reason fit for the state file, the journal and a label
// value: control characters become spaces, it is trimmed and bounded. A
// halt never refuses a reason.
func cleanReason(reason string) string {
	reason = strings.ToValidUTF8(reason, "?")
	reason = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, reason)
	reason = strings.TrimSpace(reason)
	if len(reason) > maxReason {
		cut := maxReason
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = strings.TrimSpace(reason[:cut])
	}
	if reason == "" {
		reason = "unspecified"
	}
	return reason
}

// Halt stops and runtime-masks the configured units, after recording the
// reason in the state file, the journal and the metrics. It is idempotent:
// a halt already in force keeps its first reason and time, and the units
// are stopped and masked again (which repairs a partial earlier attempt).
// Halt returns an error when any unit could not be proven stopped and
// masked; everything it could do is done by then.
func (h *Halter) Halt(ctx context.Context, reason string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	reason = cleanReason(reason)
	st, err := h.Status()
	first := errors.Is(err, ErrNotHalted)
	if err != nil && !first {
		// Unreadable state file: halt anyway, rewrite it.
		h.log.Error("halt state file unreadable, rewriting it", "path", h.cfg.StateFile, "error", err)
		first = true
	}
	if first {
		st = State{Reason: reason, Since: h.now().UTC(), Units: h.cfg.Units}
	}
	// Record first: if systemd cannot be reached, the halt is still on
	// record (and alerting on the metric fires).
	werr := h.writeState(st)
	h.metrics.setHalted(st.Reason)
	if first {
		h.metrics.halts.Inc()
		h.log.Error("fail-deadly halt: stopping and masking the API daemons", "reason", st.Reason, "units", h.cfg.Units)
	} else {
		h.log.Warn("halt requested while halted: enforcing again", "reason", reason, "halted_reason", st.Reason)
	}
	err = h.enforce(ctx)
	if err = errors.Join(werr, err); err != nil {
		h.metrics.failures.Inc()
		h.log.Error("fail-deadly halt incomplete", "reason", st.Reason, "error", err)
		return err
	}
	h.log.Info("halt in force", "reason", st.Reason, "units", h.cfg.Units)
	return nil
}

// enforce masks (runtime), reloads, stops and verifies every unit. It does
// every step it can, then reports what failed.
func (h *Halter) enforce(ctx context.Context) error {
	sd, err := h.dial(ctx)
	if err != nil {
		return fmt.Errorf("halt: %w", err)
	}
	defer sd.Close()
	var errs []error
	// Mask before stopping, so nothing (Restart=, a dependency, a socket)
	// can start a unit again between the two.
	if _, err := sd.MaskUnitFilesContext(ctx, h.cfg.Units, true, true); err != nil {
		errs = append(errs, fmt.Errorf("halt: runtime-mask %v: %w", h.cfg.Units, err))
	}
	if err := sd.ReloadContext(ctx); err != nil {
		errs = append(errs, fmt.Errorf("halt: reload systemd: %w", err))
	}
	for _, u := range h.cfg.Units {
		if err := runJob(ctx, sd.StopUnitContext, u); err != nil {
			errs = append(errs, fmt.Errorf("halt: stop %s: %w", u, err))
		}
	}
	for _, u := range h.cfg.Units {
		if err := verify(ctx, sd, u, true); err != nil {
			errs = append(errs, fmt.Errorf("halt: %w", err))
		}
	}
	return errors.Join(errs...)
}

type jobFunc func(ctx context.Context, name, mode string, ch chan<- string) (int, error)

// runJob queues a job for unit and waits for its result.
func runJob(ctx context.Context, job jobFunc, unit string) error {
	ch := make(chan string, 1)
	if _, err := job(ctx, unit, "replace", ch); err != nil {
		return err
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("job result %q", res)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for job: %w", ctx.Err())
	}
}

// verify checks a unit's state through systemd: halted means masked and not
// running; recovered means not masked and running.
func verify(ctx context.Context, sd systemd, unit string, halted bool) error {
	p, err := sd.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		return fmt.Errorf("read state of %s: %w", unit, err)
	}
	load, _ := p["LoadState"].(string)
	active, _ := p["ActiveState"].(string)
	if halted {
		if load != "masked" {
			return fmt.Errorf("%s not masked after runtime mask (LoadState=%s)", unit, load)
		}
		if active != "inactive" && active != "failed" {
			return fmt.Errorf("%s still %s", unit, active)
		}
		return nil
	}
	if load == "masked" {
		return fmt.Errorf("%s still masked (a persistent mask is not ours to lift)", unit)
	}
	if active != "active" && active != "activating" && active != "reloading" {
		return fmt.Errorf("%s is %s after start", unit, active)
	}
	return nil
}

// Recover lifts a halt: it refuses (a *CauseError, nothing changed) while
// check reports the cause persisting, returns ErrNotHalted when no halt is
// recorded, and otherwise unmasks the units (runtime), resets their failed
// state and start rate limit, starts them, and removes the state file once
// they run. An unreadable state file is an error (remove it by hand after
// checking the units).
func (h *Halter) Recover(ctx context.Context, check CauseCheck) error {
	if check == nil {
		return errors.New("halt: recover needs a cause check")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st, err := h.Status()
	if err != nil {
		return err
	}
	if err := check(ctx, st); err != nil {
		h.log.Warn("recover refused: cause persists", "reason", st.Reason, "cause", err)
		return &CauseError{Err: err}
	}
	units := st.Units
	if len(units) == 0 {
		units = h.cfg.Units
	}
	if err := h.lift(ctx, units); err != nil {
		return err
	}
	if err := os.Remove(h.cfg.StateFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("halt: remove state file: %w", err)
	}
	h.metrics.setHalted("")
	h.log.Info("recovered from halt", "reason", st.Reason, "since", st.Since, "units", units)
	return nil
}

func (h *Halter) lift(ctx context.Context, units []string) error {
	sd, err := h.dial(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	defer sd.Close()
	if _, err := sd.UnmaskUnitFilesContext(ctx, units, true); err != nil {
		return fmt.Errorf("recover: unmask %v: %w", units, err)
	}
	if err := sd.ReloadContext(ctx); err != nil {
		return fmt.Errorf("recover: reload systemd: %w", err)
	}
	var errs []error
	for _, u := range units {
		// Clear a failed state and the start rate limit (repeated halts and
		// recoveries can hit StartLimitBurst): recovering is an explicit
		// request to run the unit. Best effort: the start reports real
		// problems.
		_ = sd.ResetFailedUnitContext(ctx, u)
		if err := runJob(ctx, sd.StartUnitContext, u); err != nil {
			errs = append(errs, fmt.Errorf("recover: start %s: %w", u, err))
		} else if err := verify(ctx, sd, u, false); err != nil {
			errs = append(errs, fmt.Errorf("recover: %w", err))
		}
	}
	return errors.Join(errs...)
}

// maxStateFile bounds what Status reads.
const maxStateFile = 64 << 10

// Status returns the recorded halt, or ErrNotHalted.
func (h *Halter) Status() (State, error) {
	f, err := os.Open(h.cfg.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, ErrNotHalted
	}
	if err != nil {
		return State{}, fmt.Errorf("halt: read state: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return State{}, fmt.Errorf("halt: read state: %w", err)
	}
	if len(b) > maxStateFile {
		return State{}, fmt.Errorf("halt: state file %s larger than %d bytes", h.cfg.StateFile, maxStateFile)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, fmt.Errorf("halt: state file %s: %w", h.cfg.StateFile, err)
	}
	st.Reason = cleanReason(st.Reason)
	return st, nil
}

// writeState writes the state file atomically (atomicfile).
func (h *Halter) writeState(st State) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("halt: encode state: %w", err)
	}
	dir := filepath.Dir(h.cfg.StateFile)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("halt: state dir: %w", err)
	}
	if err := atomicfile.Write(h.cfg.StateFile, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("halt: write state: %w", err)
	}
	return nil
}
