package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// checker is a containment check that runs one command in the guest.
type checker struct{}

func (checker) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	res, err := t.Guest.Exec(ctx, sandbox.GuestExec{Argv: []string{"echo", "ok"}})
	if err != nil {
		return apitype.CheckReport{}, err
	}
	ok := string(res.Stdout) == "ok\n"
	return apitype.CheckReport{Pass: ok, Rows: []apitype.CheckRow{{Target: "control", Probe: "exec", Expected: "ok", Observed: strings.TrimSpace(string(res.Stdout)), Pass: ok, Control: true}}}, nil
}

// tokens is a fixed TokenVerifier.
type tokens map[string][]string

func (t tokens) Verify(tok string) (string, []string, error) {
	s, ok := t[tok]
	if !ok {
		return "", nil, errors.New("unknown token")
	}
	return "tok-" + tok, s, nil
}

// recorder wraps the API and records what the tools asked of it.
type recorder struct {
	mcpserver.API
	mu       sync.Mutex
	modes    map[string]uint32 // path -> mode of the last write
	execErrs []error           // errors of streamed execs
	started  int               // streamed execs asked of the API
	// shared, when set, receives the exec errors instead (one recorder per
	// HTTP session, one place to look).
	shared *recorder
}

func (r *recorder) WriteFile(ctx context.Context, id, vm, path string, rd io.Reader, size int64, mode uint32) error {
	r.mu.Lock()
	r.modes[path] = mode
	r.mu.Unlock()
	return r.API.WriteFile(ctx, id, vm, path, rd, size, mode)
}

func (r *recorder) ExecStream(ctx context.Context, id, vm string, req apitype.ExecRequest, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	to := r
	if r.shared != nil {
		to = r.shared
	}
	to.mu.Lock()
	to.started++
	to.mu.Unlock()
	res, err := r.API.ExecStream(ctx, id, vm, req, stdout, stderr)
	to.mu.Lock()
	to.execErrs = append(to.execErrs, err)
	to.mu.Unlock()
	return res, err
}

// startedExecs returns how many streamed execs were asked of the API.
func (r *recorder) startedExecs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started
}

// waitExecStarted waits (a minute) for a streamed exec after the first s0
// to be asked of the API: a call cancelled before it reached the API
// would never run it.
func (r *recorder) waitExecStarted(t *testing.T, s0 int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); r.startedExecs() <= s0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tool call never asked the API to exec")
		}
	}
}

// execs returns how many streamed execs ended and the error of the last.
func (r *recorder) execs() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.execErrs) == 0 {
		return 0, nil
	}
	return len(r.execErrs), r.execErrs[len(r.execErrs)-1]
}

// bed is a sandbox API on the apitest fakes with an MCP client session on
// the in-memory transport.
type bed struct {
	t        *testing.T
	srv      *sandboxapi.Server
	guests   *apitest.Guests
	api      *recorder
	tcp      *httptest.Server // sandbox API Handler (bearer tokens)
	sess     *mcp.ClientSession
	progress chan *mcp.ProgressNotificationParams
}

type bedOpts struct {
	api    func(*sandbox.Options)
	mcp    func(*mcpserver.Options)
	scopes []string
	tokens sandboxapi.TokenVerifier // the API's tokens (default r, x, a)
}

func newBed(t *testing.T, bo bedOpts) *bed {
	t.Helper()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	o := sandbox.Options{
		Node: "node1", Proxmox: px, Guests: g.Dial, Checker: checker{},
		StateDir: t.TempDir(), AgentTimeout: 2 * time.Second,
		Caps:   sandbox.Caps{NodeVCPUs: 5},
		Logger: slog.New(slog.DiscardHandler),
	}
	if bo.api != nil {
		bo.api(&o)
	}
	eng, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	var toks sandboxapi.TokenVerifier = tokens{"r": {"read"}, "x": {"exec"}, "a": {"admin"}}
	if bo.tokens != nil {
		toks = bo.tokens
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		Tokens:   toks,
		SpoolDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	local := httptest.NewServer(srv.LocalHandler())
	t.Cleanup(local.Close)
	tcp := httptest.NewServer(srv.Handler())
	t.Cleanup(tcp.Close)
	mo := mcpserver.Options{DefaultTemplate: "debian"}
	if bo.mcp != nil {
		bo.mcp(&mo)
	}
	if err := mo.Validate(); err != nil {
		t.Fatal(err)
	}
	scopes := bo.scopes
	if scopes == nil {
		scopes = []string{apitype.ScopeAdmin}
	}
	b := &bed{t: t, srv: srv, guests: g, tcp: tcp, progress: make(chan *mcp.ProgressNotificationParams, 100),
		api: &recorder{API: client.New(local.URL), modes: map[string]uint32{}}}
	ms := mcpserver.New(b.api, mo, scopes...)
	st, ct := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ss, err := ms.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	b.sess = b.connect(ctx, ct)
	return b
}

// connect opens a client session that collects progress notifications.
func (b *bed) connect(ctx context.Context, t mcp.Transport) *mcp.ClientSession {
	b.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			select {
			case b.progress <- r.Params:
			default:
			}
		},
	})
	cs, err := c.Connect(ctx, t, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func (b *bed) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b.t.Cleanup(cancel)
	return ctx
}

// call calls a tool and fails the test on a protocol error.
func (b *bed) call(name string, args any) *mcp.CallToolResult {
	b.t.Helper()
	return callOn(b.t, b.ctx(), b.sess, name, args)
}

func callOn(t *testing.T, ctx context.Context, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// ok decodes a successful result's structured content into out.
func ok[T any](t *testing.T, name string, res *mcp.CallToolResult) T {
	t.Helper()
	var out T
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: structured content %s: %v", name, b, err)
	}
	return out
}

// problem returns the problem document of a tool error.
func problem(t *testing.T, name string, res *mcp.CallToolResult) apitype.Problem {
	t.Helper()
	if !res.IsError {
		t.Fatalf("%s: want a tool error, got %s", name, text(res))
	}
	var p apitype.Problem
	if err := json.Unmarshal([]byte(text(res)), &p); err != nil {
		return apitype.Problem{Type: "sdk", Detail: text(res)}
	}
	return p
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// create makes a small sandbox through the tool.
func (b *bed) create() apitype.Sandbox {
	b.t.Helper()
	return ok[apitype.Sandbox](b.t, "create", b.call(mcpserver.ToolCreate, map[string]any{"labels": map[string]string{"agent": "t"}}))
}
