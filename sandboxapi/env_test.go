package sandboxapi_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// tokens is a fixed TokenVerifier.
type tokens map[string][]string

func (t tokens) Verify(tok string) (string, []string, error) {
	s, ok := t[tok]
	if !ok {
		return "", nil, errors.New("unknown token")
	}
	return "tok-" + tok, s, nil
}

type env struct {
	t      testing.TB
	px     *apitest.Proxmox
	guests *apitest.Guests
	clock  *testkit.Clock
	reg    *prometheus.Registry
	srv    *sandboxapi.Server
	http   *httptest.Server // LocalHandler (unix-socket semantics)
	tcp    *httptest.Server // Handler (bearer tokens)
	c      *client.Client
	opts   options
}

// serverOptions is the HTTP layer's options under a name of its own, so
// options can embed it beside the engine's.
type serverOptions = sandboxapi.Options

// options are a test server's engine and HTTP options in one struct: a
// field name is promoted from whichever has it (Logger and Registerer are
// set on both here).
type options struct {
	sandbox.Options
	serverOptions
}

func templates() map[string]int { return map[string]int{"debian": 9000, "kali": 9001} }

// newEnv builds a server on fakes; mod may change the options.
func newEnv(t testing.TB, mod func(*options)) *env {
	t.Helper()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, templates())
	return newEnvOn(t, px, g, t.TempDir(), mod)
}

func newEnvOn(t testing.TB, px *apitest.Proxmox, g *apitest.Guests, stateDir string, mod func(*options)) *env {
	t.Helper()
	e := &env{t: t, px: px, guests: g, clock: testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), reg: prometheus.NewRegistry()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e.opts = options{
		Options: sandbox.Options{
			Node:         "node1",
			Proxmox:      px,
			Guests:       g.Dial,
			Checker:      checker{},
			StateDir:     stateDir,
			Templates:    map[string]int{"debian": 9000},
			AgentTimeout: 2 * time.Second,
			Now:          e.clock.Now,
			Registerer:   e.reg,
			Logger:       log,
		},
		serverOptions: sandboxapi.Options{
			Tokens:     tokens{"r": {"read"}, "x": {"exec"}, "a": {"admin"}},
			SpoolDir:   t.TempDir(),
			Registerer: e.reg,
			Logger:     log,
		},
	}
	if mod != nil {
		mod(&e.opts)
	}
	eng, err := sandbox.New(e.opts.Options)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sandboxapi.New(eng, e.opts.serverOptions)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	if _, err := eng.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.http = httptest.NewServer(srv.LocalHandler())
	e.tcp = httptest.NewServer(srv.Handler())
	t.Cleanup(e.http.Close)
	t.Cleanup(e.tcp.Close)
	e.c = client.New(e.http.URL)
	return e
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *env) create(req apitype.CreateRequest) apitype.Sandbox {
	e.t.Helper()
	sb, err := e.c.Create(e.ctx(), req)
	if err != nil {
		e.t.Fatalf("create: %v", err)
	}
	return sb
}

// checker is a Checker that reports one probe per other sandbox plus a
// positive control run through the guest.
type checker struct{}

func (checker) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	res, err := t.Guest.Exec(ctx, sandbox.GuestExec{Argv: []string{"echo", "ok"}})
	if err != nil {
		return apitype.CheckReport{}, err
	}
	rows := []apitype.CheckRow{{Target: "control", Probe: "exec", Expected: "ok", Observed: string(res.Stdout), Pass: string(res.Stdout) == "ok\n", Control: true}}
	for _, o := range t.Others {
		rows = append(rows, apitype.CheckRow{Target: o.ID, Probe: "tcp", Expected: "blocked", Observed: "blocked", Pass: true})
	}
	pass := !slices.ContainsFunc(rows, func(r apitype.CheckRow) bool { return !r.Pass })
	return apitype.CheckReport{Pass: pass, Rows: rows}, nil
}

// rawRequest sends a request to the local handler and returns the response.
func (e *env) raw(method, path, ctype string, body io.Reader) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.http.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// metric returns the value of the series name{labels...} (0 when absent).
func (e *env) metric(name string, labels ...string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

// countedGuest counts the guest I/O calls it is handed (exec, streamed
// exec, file read and write): a call counted there reached the guest
// agent, with its timeout.
type countedGuest struct {
	sandbox.Guest
	calls *atomic.Int64
}

func (g countedGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	g.calls.Add(1)
	return g.Guest.Exec(ctx, r)
}

func (g countedGuest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	g.calls.Add(1)
	return g.Guest.ExecStream(ctx, r, stdout, stderr)
}

func (g countedGuest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	g.calls.Add(1)
	return g.Guest.ReadFile(ctx, path, w, max)
}

func (g countedGuest) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	g.calls.Add(1)
	return g.Guest.WriteFile(ctx, path, r, mode)
}

// countGuests makes o's guests countedGuests counting into calls.
func countGuests(o *options, calls *atomic.Int64) {
	dial := o.Guests
	o.Guests = func(p string) sandbox.Guest { return countedGuest{Guest: dial(p), calls: calls} }
}

// series counts the series of a metric family.
func (e *env) series(name string) int {
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}
