package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// API is the part of the sandbox API the tools use; *client.Client
// implements it (over the unix socket, TCP or in process).
type API interface {
	Create(ctx context.Context, r apitype.CreateRequest) (apitype.Sandbox, error)
	List(ctx context.Context) ([]apitype.Sandbox, error)
	Get(ctx context.Context, id string) (apitype.Sandbox, error)
	Extend(ctx context.Context, id string, ttl time.Duration) (apitype.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Exec(ctx context.Context, id, vm string, r apitype.ExecRequest) (*apitype.ExecResult, error)
	ExecStream(ctx context.Context, id, vm string, r apitype.ExecRequest, stdout, stderr io.Writer) (*apitype.ExecResult, error)
	WriteFile(ctx context.Context, id, vm, path string, r io.Reader, size int64, mode uint32) error
	ReadFile(ctx context.Context, id, vm, path string, w io.Writer) (int64, error)
	Snapshot(ctx context.Context, id, vm, name string) error
	Rollback(ctx context.Context, id, vm, name string) error
	Check(ctx context.Context, id, vm string) (apitype.CheckReport, error)
	EgressLog(ctx context.Context, id string, q apitype.EgressLogQuery) (apitype.EgressLog, error)
}

// Preset is a named VM size an agent can ask for instead of a template and
// numbers.
type Preset struct {
	// Template is the template name (default: Options.DefaultTemplate).
	Template string
	// Kind is apitype.KindLXC for a container preset (its Template a
	// container template, no DiskGiB); empty for a VM.
	Kind      string
	Cores     int
	MemoryMiB int
	DiskGiB   int
}

// Options configure the MCP server. Zero values take the documented
// defaults.
type Options struct {
	// Presets are the sizes create accepts (default small = 2 cores/4 GiB,
	// medium = 4 cores/8 GiB).
	Presets map[string]Preset
	// DefaultPreset is the size when the agent names none ("small").
	DefaultPreset string
	// DefaultTemplate is the template of presets without one, and of a
	// create that names neither size nor template.
	DefaultTemplate string
	// DefaultLifetime (4h) and MaxLifetime (24h) bound lifetimes; agents
	// give them in whole hours, at least 1.
	DefaultLifetime, MaxLifetime time.Duration
	// MaxReadBytes caps a file read (8 MiB): the content travels inside
	// one JSON-RPC message.
	MaxReadBytes int64
	// MaxWriteBytes caps a file write's decoded content (8 MiB).
	MaxWriteBytes int64
	// OutputLimit caps each of a command's stdout and stderr (1 MiB).
	OutputLimit int64
	// Env holds secrets (e.g. model API keys) sent with every create
	// (apitype.CreateRequest.Env): the API writes them into each VM at
	// apitype.GuestEnvPath, mode 0600 (root only). Never returned or
	// logged. A server from New sends them on every create (the stdio
	// server: whoever runs it read them); HTTPHandler only in the
	// sessions of the tokens EnvTokens and EnvOwners name.
	Env map[string]string
	// EnvTokens (token names) and EnvOwners (owners a token is bound to)
	// are the HTTP callers whose creates carry Env. Any other token, an
	// admin token bound to no owner included, gets none; both empty (the
	// default): no HTTP caller gets Env.
	EnvTokens, EnvOwners []string
	// Version is the server version reported to clients.
	Version string
	// Logger receives one line per failed tool call (never arguments).
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.Presets == nil {
		o.Presets = map[string]Preset{
			"small":  {Cores: 2, MemoryMiB: 4096},
			"medium": {Cores: 4, MemoryMiB: 8192},
		}
	}
	if o.DefaultPreset == "" {
		o.DefaultPreset = "small"
	}
	if o.DefaultLifetime == 0 {
		o.DefaultLifetime = 4 * time.Hour
	}
	if o.MaxLifetime == 0 {
		o.MaxLifetime = 24 * time.Hour
	}
	if o.MaxReadBytes == 0 {
		o.MaxReadBytes = 8 << 20
	}
	if o.MaxWriteBytes == 0 {
		o.MaxWriteBytes = 8 << 20
	}
	if o.OutputLimit == 0 {
		o.OutputLimit = 1 << 20
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Logger = o.Logger.With("component", "mcp")
}

// Validate reports a configuration that cannot work: a default preset
// that does not exist, a default lifetime outside 1h..max, sizes below 1.
func (o Options) Validate() error {
	o.defaults()
	if _, ok := o.Presets[o.DefaultPreset]; !ok {
		return fmt.Errorf("mcp: default preset %q is not one of the presets %v", o.DefaultPreset, slices.Sorted(maps.Keys(o.Presets)))
	}
	for name, p := range o.Presets {
		if p.Cores < 1 || p.MemoryMiB < 64 || p.DiskGiB < 0 {
			return fmt.Errorf("mcp: preset %q: cores must be >= 1 and memory_mib >= 64", name)
		}
		if p.Kind != "" && p.Kind != apitype.KindLXC || p.Kind == apitype.KindLXC && p.DiskGiB != 0 {
			return fmt.Errorf("mcp: preset %q: kind %q: want empty (a VM) or %q (a container, without disk_gib)", name, p.Kind, apitype.KindLXC)
		}
	}
	if o.MaxLifetime < time.Hour || o.DefaultLifetime < time.Hour || o.DefaultLifetime > o.MaxLifetime {
		return fmt.Errorf("mcp: lifetimes must satisfy 1h <= default (%s) <= max (%s)", o.DefaultLifetime, o.MaxLifetime)
	}
	if err := apitype.ValidateEnv(o.Env); err != nil {
		return fmt.Errorf("mcp: env: %w", err)
	}
	for _, n := range slices.Concat(o.EnvTokens, o.EnvOwners) {
		if n == "" {
			return errors.New("mcp: env tokens and owners: an empty name matches no token")
		}
	}
	return nil
}

// envFor returns o with Env only when the caller is one the env is for:
// a token named in EnvTokens or bound to an owner in EnvOwners.
func (o Options) envFor(name, owner string) Options {
	if !slices.Contains(o.EnvTokens, name) && (owner == "" || !slices.Contains(o.EnvOwners, owner)) {
		o.Env = nil
	}
	return o
}

// MaxMessageBytes is the largest JSON-RPC message the transports must take
// for these options: a sandbox_write_file of MaxWriteBytes, base64-encoded,
// with room for the rest of the message.
func MaxMessageBytes(o Options) int64 {
	o.defaults()
	return o.MaxWriteBytes/3*4 + 8 + 1<<20
}

// New returns an MCP server whose tools call api and are those the scopes
// allow (apitype.ScopeRead, ScopeExec, ScopeAdmin; the highest counts).
func New(api API, o Options, scopes ...string) *mcp.Server {
	o.defaults()
	srv := mcp.NewServer(&mcp.Implementation{Name: "pve-inspect", Title: "pve-inspect sandboxes", Version: o.Version}, &mcp.ServerOptions{
		Instructions: "Disposable Proxmox VM sandboxes: create one, run commands and move files inside it, destroy it when done. " +
			"Sandboxes expire after their lifetime; extend to keep one. Tool errors carry a problem document with a stable type.",
		Logger: o.Logger,
	})
	t := &tools{api: api, o: o}
	t.register(srv, rank(scopes))
	return srv
}

// rank maps scopes to 0 (none), 1 (read), 2 (exec), 3 (admin).
func rank(scopes []string) int {
	r := 0
	for _, s := range scopes {
		switch s {
		case apitype.ScopeRead:
			r = max(r, 1)
		case apitype.ScopeExec:
			r = max(r, 2)
		case apitype.ScopeAdmin:
			r = max(r, 3)
		}
	}
	return r
}

// ToolError is the error of a tool call the agent can act on: the API's
// problem document. Its text (what the agent reads) is the document as
// JSON.
type ToolError struct{ Problem *apitype.Problem }

// Error implements error.
func (e *ToolError) Error() string {
	b, err := json.Marshal(e.Problem)
	if err != nil {
		return e.Problem.Error()
	}
	return string(b)
}

// Unwrap returns the problem.
func (e *ToolError) Unwrap() error { return e.Problem }

// invalid returns an invalid-request tool error naming the field.
func invalid(field, format string, a ...any) error {
	return &ToolError{&apitype.Problem{Type: apitype.ProblemInvalidRequest, Title: "Invalid request", Status: 400,
		Detail: fmt.Sprintf(format, a...), Field: field}}
}

// toolErr turns an API error into a tool error: a problem stays as it is,
// anything else (the daemon unreachable) becomes "unavailable".
func toolErr(err error) error {
	var te *ToolError
	if errors.As(err, &te) {
		return te
	}
	var p *apitype.Problem
	if errors.As(err, &p) {
		return &ToolError{p}
	}
	if errors.Is(err, context.Canceled) {
		return &ToolError{&apitype.Problem{Type: apitype.ProblemTimeout, Title: "Cancelled", Status: 499, Detail: err.Error()}}
	}
	return &ToolError{&apitype.Problem{Type: apitype.ProblemUnavailable, Title: "Service unavailable", Status: 503,
		Detail: "sandbox API: " + err.Error()}}
}
