package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// tools holds what every tool handler needs.
type tools struct {
	api API
	o   Options
}

// Tool names.
const (
	ToolCreate    = "sandbox_create"
	ToolList      = "sandbox_list"
	ToolGet       = "sandbox_get"
	ToolExec      = "sandbox_exec"
	ToolReadFile  = "sandbox_read_file"
	ToolWriteFile = "sandbox_write_file"
	ToolExtend    = "sandbox_extend"
	ToolDestroy   = "sandbox_destroy"
	ToolSnapshot  = "sandbox_snapshot"
	ToolRollback  = "sandbox_rollback"
	ToolCheck     = "sandbox_check"
	ToolEgressLog = "sandbox_egress_log"
)

// MaxEgressLogRecords is the most records one sandbox_egress_log call
// returns (DefaultEgressLogRecords when it asks for no number): the page
// travels inside one JSON-RPC message.
const (
	MaxEgressLogRecords     = 500
	DefaultEgressLogRecords = 100
)

func ptr[T any](v T) *T { return &v }

// register adds the tools the scope rank allows.
func (t *tools) register(s *mcp.Server, r int) {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}
	if r >= 1 {
		mcp.AddTool(s, &mcp.Tool{Name: ToolList, Annotations: ro,
			Description: "List the sandboxes you can see, with their VMs, state and expiry."}, t.list)
		mcp.AddTool(s, &mcp.Tool{Name: ToolGet, Annotations: ro,
			Description: "Get one sandbox by id: its VMs (names for the other tools), networks, state, expiry and health " +
				"(ok, degraded or broken with the reason, from signals the node reads; a broken VM refuses exec and file calls with sandbox-broken)."}, t.get)
		mcp.AddTool(s, &mcp.Tool{Name: ToolEgressLog, Annotations: ro,
			Description: fmt.Sprintf("Read a sandbox's egress record, oldest first: the DNS questions its VMs asked the node's resolver and the connections its proxy handled "+
				"(name, verdict and why, destination, bytes each way), written by the node only; no payload. Page with since = the previous page's next while more is true "+
				"(at most %d records a call, default %d); dropped counts records the bounded record no longer holds.", MaxEgressLogRecords, DefaultEgressLogRecords)}, t.egressLog)
	}
	if r >= 2 {
		mcp.AddTool(s, &mcp.Tool{Name: ToolExec, Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(true)},
			Description: "Run a command in a sandbox VM (argv, or command for a shell line) and get its exit code, stdout and stderr; " +
				"output is capped per stream and says when it was truncated; a timeout kills the whole process tree."}, t.exec)
		mcp.AddTool(s, &mcp.Tool{Name: ToolReadFile, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
			Description: fmt.Sprintf("Read a file from a sandbox VM as text or base64 (at most %d bytes; larger files are an output-limit error).", t.o.MaxReadBytes)}, t.readFile)
		mcp.AddTool(s, &mcp.Tool{Name: ToolWriteFile, Annotations: &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: ptr(false), DestructiveHint: ptr(true)},
			Description: "Write a file into a sandbox VM (text or base64 content, optional octal mode), replacing it if it exists."}, t.writeFile)
		mcp.AddTool(s, &mcp.Tool{Name: ToolSnapshot, Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
			Description: "Snapshot a sandbox VM's disk under a name, to roll back to later."}, t.snapshot)
		mcp.AddTool(s, &mcp.Tool{Name: ToolRollback, Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(true)},
			Description: "Roll a sandbox VM back to a named snapshot (discards later changes; the VM is running again when this returns)."}, t.rollback)
		mcp.AddTool(s, &mcp.Tool{Name: ToolCheck, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
			Description: "Run the containment check from inside a sandbox VM or container: a table of probes (node, metadata, LAN, other sandboxes, internet; from a container also its walls on the shared kernel) with expected and observed results."}, t.check)
	}
	if r >= 3 {
		sizes := slices.Sorted(maps.Keys(t.o.Presets))
		var b strings.Builder
		for i, n := range sizes {
			p := t.o.Presets[n]
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s = %d cores/%d MiB", n, p.Cores, p.MemoryMiB)
		}
		mcp.AddTool(s, &mcp.Tool{Name: ToolCreate, Annotations: &mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
			Description: fmt.Sprintf("Create a disposable VM sandbox (size %s; default %s) living lifetime_hours (1..%d, default %d); returns when its VM answers. "+
				"Refused with the reason when a resource cap would be exceeded.", b.String(), t.o.DefaultPreset, int(t.o.MaxLifetime/time.Hour), int(t.o.DefaultLifetime/time.Hour))}, t.create)
		mcp.AddTool(s, &mcp.Tool{Name: ToolExtend, Annotations: &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
			Description: "Set a sandbox's expiry to now plus lifetime_hours."}, t.extend)
		mcp.AddTool(s, &mcp.Tool{Name: ToolDestroy, Annotations: &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: ptr(false), DestructiveHint: ptr(true)},
			Description: "Destroy a sandbox and everything in it now (idempotent)."}, t.destroy)
	}
}

// CreateInput are the arguments of sandbox_create.
type CreateInput struct {
	Size          string            `json:"size,omitempty" jsonschema:"size preset name (see the tool description); default from config"`
	Template      string            `json:"template,omitempty" jsonschema:"template name; default: the preset's template"`
	LifetimeHours int               `json:"lifetime_hours,omitempty" jsonschema:"lifetime in whole hours, 1..24 (default 4)"`
	Labels        map[string]string `json:"labels,omitempty" jsonschema:"free key/value labels returned by list and get"`
}

// SandboxList is the result of sandbox_list.
type SandboxList struct {
	Sandboxes []apitype.Sandbox `json:"sandboxes"`
}

// IDInput names a sandbox.
type IDInput struct {
	ID string `json:"id" jsonschema:"sandbox id"`
}

// ExtendInput are the arguments of sandbox_extend.
type ExtendInput struct {
	ID            string `json:"id" jsonschema:"sandbox id"`
	LifetimeHours int    `json:"lifetime_hours" jsonschema:"new lifetime from now in whole hours, 1..24"`
}

// Destroyed is the result of sandbox_destroy.
type Destroyed struct {
	ID        string `json:"id"`
	Destroyed bool   `json:"destroyed"`
}

// SnapshotInput are the arguments of sandbox_snapshot and sandbox_rollback.
type SnapshotInput struct {
	ID   string `json:"id" jsonschema:"sandbox id"`
	VM   string `json:"vm,omitempty" jsonschema:"VM name in the sandbox; default: its first VM"`
	Name string `json:"name" jsonschema:"snapshot name (letters, digits, - and _)"`
}

// SnapshotResult is the result of sandbox_snapshot and sandbox_rollback.
type SnapshotResult struct {
	ID   string `json:"id"`
	VM   string `json:"vm"`
	Name string `json:"name"`
}

// CheckInput are the arguments of sandbox_check.
type CheckInput struct {
	ID string `json:"id" jsonschema:"sandbox id"`
	VM string `json:"vm,omitempty" jsonschema:"VM or container to probe from; default: the first the check can run in (a Linux VM with a guest agent, or a container)"`
}

// EgressLogInput are the arguments of sandbox_egress_log.
type EgressLogInput struct {
	ID    string `json:"id" jsonschema:"sandbox id"`
	Type  string `json:"type,omitempty" jsonschema:"only records of this type: dns or conn; default both"`
	VM    string `json:"vm,omitempty" jsonschema:"only records of this VM of the sandbox (its name); default all"`
	Since uint64 `json:"since,omitempty" jsonschema:"only records after this seq: the previous page's next; default from the first"`
	Limit int    `json:"limit,omitempty" jsonschema:"the most records returned, 1..500 (default 100)"`
}

func needID(id string) error {
	if strings.TrimSpace(id) == "" {
		return invalid("id", "id is required: a sandbox id from sandbox_list or sandbox_create")
	}
	return nil
}

// lifetime turns whole hours into a duration within 1h..MaxLifetime.
func (t *tools) lifetime(h int, def time.Duration) (time.Duration, error) {
	if h == 0 {
		return def, nil
	}
	maxH := int(t.o.MaxLifetime / time.Hour)
	if h < 1 || h > maxH {
		return 0, invalid("lifetime_hours", "lifetime_hours must be 1..%d, got %d", maxH, h)
	}
	return time.Duration(h) * time.Hour, nil
}

func (t *tools) create(ctx context.Context, _ *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, apitype.Sandbox, error) {
	var zero apitype.Sandbox
	size := in.Size
	if size == "" {
		size = t.o.DefaultPreset
	}
	p, ok := t.o.Presets[size]
	if !ok {
		return nil, zero, invalid("size", "unknown size %q; one of %v", size, slices.Sorted(maps.Keys(t.o.Presets)))
	}
	tmpl := in.Template
	if tmpl == "" {
		tmpl = p.Template
	}
	if tmpl == "" {
		tmpl = t.o.DefaultTemplate
	}
	if tmpl == "" {
		return nil, zero, invalid("template", "no template: name one (the server has no default template)")
	}
	ttl, err := t.lifetime(in.LifetimeHours, t.o.DefaultLifetime)
	if err != nil {
		return nil, zero, err
	}
	sb, err := t.api.Create(ctx, apitype.CreateRequest{
		VMs:        []apitype.VMRequest{{Kind: p.Kind, Template: tmpl, Cores: p.Cores, MemoryMiB: p.MemoryMiB, DiskGiB: p.DiskGiB}},
		Labels:     in.Labels,
		TTLSeconds: int64(ttl / time.Second),
		Env:        t.o.Env,
	})
	if err != nil {
		return nil, zero, toolErr(err)
	}
	return nil, sb, nil
}

func (t *tools) list(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, SandboxList, error) {
	l, err := t.api.List(ctx)
	if err != nil {
		return nil, SandboxList{}, toolErr(err)
	}
	if l == nil {
		l = []apitype.Sandbox{}
	}
	return nil, SandboxList{Sandboxes: l}, nil
}

func (t *tools) get(ctx context.Context, _ *mcp.CallToolRequest, in IDInput) (*mcp.CallToolResult, apitype.Sandbox, error) {
	if err := needID(in.ID); err != nil {
		return nil, apitype.Sandbox{}, err
	}
	sb, err := t.api.Get(ctx, in.ID)
	if err != nil {
		return nil, apitype.Sandbox{}, toolErr(err)
	}
	return nil, sb, nil
}

func (t *tools) extend(ctx context.Context, _ *mcp.CallToolRequest, in ExtendInput) (*mcp.CallToolResult, apitype.Sandbox, error) {
	if err := needID(in.ID); err != nil {
		return nil, apitype.Sandbox{}, err
	}
	if in.LifetimeHours == 0 {
		return nil, apitype.Sandbox{}, invalid("lifetime_hours", "lifetime_hours is required (1..%d)", int(t.o.MaxLifetime/time.Hour))
	}
	ttl, err := t.lifetime(in.LifetimeHours, 0)
	if err != nil {
		return nil, apitype.Sandbox{}, err
	}
	sb, err := t.api.Extend(ctx, in.ID, ttl)
	if err != nil {
		return nil, apitype.Sandbox{}, toolErr(err)
	}
	return nil, sb, nil
}

func (t *tools) destroy(ctx context.Context, _ *mcp.CallToolRequest, in IDInput) (*mcp.CallToolResult, Destroyed, error) {
	if err := needID(in.ID); err != nil {
		return nil, Destroyed{}, err
	}
	if err := t.api.Delete(ctx, in.ID); err != nil {
		return nil, Destroyed{}, toolErr(err)
	}
	return nil, Destroyed{ID: in.ID, Destroyed: true}, nil
}

// vm resolves the VM name of a snapshot call: the given one, or the
// sandbox's first VM.
func (t *tools) vm(ctx context.Context, id, vm string) (string, error) {
	return t.pickVM(ctx, id, vm, func(apitype.VM) bool { return true })
}

// guestVM resolves the VM name of a guest call (exec, files): the given
// one, or the sandbox's first VM with a guest agent (a VM created with
// agent false refuses every guest call; the containment check defaults
// the same way), its first VM when none has one.
func (t *tools) guestVM(ctx context.Context, id, vm string) (string, error) {
	return t.pickVM(ctx, id, vm, apitype.VM.HasAgent)
}

// pickVM returns vm when given, else the first VM of sandbox id that
// prefer takes, else its first VM.
func (t *tools) pickVM(ctx context.Context, id, vm string, prefer func(apitype.VM) bool) (string, error) {
	if err := needID(id); err != nil {
		return "", err
	}
	if vm != "" {
		return vm, nil
	}
	sb, err := t.api.Get(ctx, id)
	if err != nil {
		return "", toolErr(err)
	}
	if len(sb.VMs) == 0 {
		return "", &ToolError{&apitype.Problem{Type: apitype.ProblemConflict, Title: "Conflict", Status: 409,
			Detail: fmt.Sprintf("sandbox %s has no VM (state %s)", id, sb.State)}}
	}
	for _, v := range sb.VMs {
		if prefer(v) {
			return v.Name, nil
		}
	}
	return sb.VMs[0].Name, nil
}

func (t *tools) snapshot(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotInput) (*mcp.CallToolResult, SnapshotResult, error) {
	return t.onSnapshot(ctx, in, t.api.Snapshot)
}

func (t *tools) rollback(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotInput) (*mcp.CallToolResult, SnapshotResult, error) {
	return t.onSnapshot(ctx, in, t.api.Rollback)
}

// onSnapshot checks a snapshot call's arguments and runs op.
func (t *tools) onSnapshot(ctx context.Context, in SnapshotInput, op func(ctx context.Context, id, vm, name string) error) (*mcp.CallToolResult, SnapshotResult, error) {
	vm, err := t.vm(ctx, in.ID, in.VM)
	if err != nil {
		return nil, SnapshotResult{}, err
	}
	if in.Name == "" {
		return nil, SnapshotResult{}, invalid("name", "name is required")
	}
	if err := op(ctx, in.ID, vm, in.Name); err != nil {
		return nil, SnapshotResult{}, toolErr(err)
	}
	return nil, SnapshotResult{ID: in.ID, VM: vm, Name: in.Name}, nil
}

func (t *tools) check(ctx context.Context, _ *mcp.CallToolRequest, in CheckInput) (*mcp.CallToolResult, apitype.CheckReport, error) {
	if err := needID(in.ID); err != nil {
		return nil, apitype.CheckReport{}, err
	}
	rep, err := t.api.Check(ctx, in.ID, in.VM)
	if err != nil {
		return nil, apitype.CheckReport{}, toolErr(err)
	}
	return nil, rep, nil
}

func (t *tools) egressLog(ctx context.Context, _ *mcp.CallToolRequest, in EgressLogInput) (*mcp.CallToolResult, apitype.EgressLog, error) {
	if err := needID(in.ID); err != nil {
		return nil, apitype.EgressLog{}, err
	}
	limit := in.Limit
	if limit == 0 {
		limit = DefaultEgressLogRecords
	}
	if limit < 1 || limit > MaxEgressLogRecords {
		return nil, apitype.EgressLog{}, invalid("limit", "limit must be 1..%d, got %d", MaxEgressLogRecords, in.Limit)
	}
	l, err := t.api.EgressLog(ctx, in.ID, apitype.EgressLogQuery{Type: in.Type, VM: in.VM, Since: in.Since, Limit: limit})
	if err != nil {
		return nil, apitype.EgressLog{}, toolErr(err)
	}
	return nil, l, nil
}

// encode returns b as text when it is valid UTF-8, else as base64.
func encode(b []byte, enc string) (string, string) {
	if enc != "base64" && utf8.Valid(b) {
		return string(b), "text"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// decode returns content as bytes per its encoding ("text" or "base64").
func decode(content, enc string) ([]byte, error) {
	switch enc {
	case "", "text":
		return []byte(content), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, invalid("content", "content is not valid base64: %v", err)
		}
		return b, nil
	}
	return nil, invalid("encoding", "encoding must be text or base64, got %q", enc)
}

// parseMode parses an octal file mode such as "0644"; "" is 0 (the API's
// default).
func parseMode(s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, invalid("mode", "mode must be octal permission bits such as 0644, got %q", s)
	}
	return uint32(m), nil
}
