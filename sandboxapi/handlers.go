package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// route is one served API route; the OpenAPI document is built from the
// same table.
type route struct {
	method, path string
	scope        string
	// node marks a node operation: refused to owner-bound tokens whatever
	// their scope (template builds).
	node    bool
	summary string
	// request and response name schemas in the OpenAPI document; "" none.
	request, response string
	// requestType/responseType are media types other than application/json.
	requestType, responseType string
	// okStatus is the success code.
	okStatus int
	params   []param
	timeout  func(*Server) time.Duration
	h        func(http.ResponseWriter, *http.Request, principal) error
}

type param struct {
	name, in, desc string
	required       bool
	// schema is the value's schema (nil: any string).
	schema func() map[string]any
}

func reqTimeout(s *Server) time.Duration { return s.o.RequestTimeout }
func createTimeout(s *Server) time.Duration {
	return 2*s.eo.CreateTimeout + 2*s.eo.ApplyTimeout + s.eo.TeardownTimeout
}
func deleteTimeout(s *Server) time.Duration { return s.eo.TeardownTimeout + s.eo.ApplyTimeout }

// vmOpTimeout bounds a check, a snapshot or a rollback: no SDN apply.
func vmOpTimeout(s *Server) time.Duration { return s.eo.CreateTimeout + s.eo.TeardownTimeout }
func fileTimeout(s *Server) time.Duration { return s.o.FileTimeout }
func execTimeout(s *Server) time.Duration {
	return time.Duration(maxExecTimeout)*time.Second + 30*time.Second
}

var (
	pID   = param{name: "id", in: "path", desc: "sandbox id", required: true}
	pVM   = param{name: "vm", in: "path", desc: "VM name in the sandbox", required: true}
	pName = param{name: "name", in: "path", desc: "snapshot name", required: true, schema: snapshotRule}
	pPath = param{name: "path", in: "query", desc: "absolute guest path, cleaned lexically (Go path.Clean) before the guest gets it; a write to a path whose last element is empty, . or .. is is-a-directory", required: true, schema: pathRule}
	pMode = param{name: "mode", in: "query", desc: "octal permission bits (up to 0777) of the written file (default 0644)", schema: modeRule}
)

func (s *Server) routeTable() []route {
	return append([]route{
		{method: "GET", path: "/v1/healthz", scope: apitype.ScopeRead, summary: "Daemon health", response: "Health", okStatus: 200, timeout: reqTimeout, h: s.healthz},
		{method: "GET", path: "/v1/capacity", scope: apitype.ScopeRead, summary: "The node's free room against its caps (sandboxes, VMs, cores, memory)", response: "Capacity", okStatus: 200, timeout: reqTimeout, h: s.capacity},
		{method: "GET", path: "/v1/openapi.json", scope: apitype.ScopeRead, summary: "This OpenAPI document", response: "", okStatus: 200, timeout: reqTimeout, h: s.openapi},
		{method: "POST", path: "/v1/sandboxes", scope: apitype.ScopeAdmin, summary: "Create a sandbox; returns when every VM answers its guest agent", request: "CreateRequest", response: "Sandbox", okStatus: 201, timeout: createTimeout, h: s.createSandbox},
		{method: "POST", path: "/v1/sandboxes/validate", scope: apitype.ScopeRead, summary: "Check a create request against this node without creating anything: every refusal a create would meet whatever else runs, and the templates the node knows", request: "CreateRequest", response: "ValidateReport", okStatus: 200, timeout: reqTimeout, h: s.validateSandbox},
		{method: "GET", path: "/v1/sandboxes", scope: apitype.ScopeRead, summary: "List sandboxes", response: "SandboxList", okStatus: 200, timeout: reqTimeout, h: s.listSandboxes},
		{method: "GET", path: "/v1/pool", scope: apitype.ScopeAdmin, summary: "The warm pool: its shapes with ready and building counts, and its unclaimed members", response: "PoolStatus", okStatus: 200, timeout: reqTimeout, h: s.getPool},
		{method: "GET", path: "/v1/sandboxes/{id}", scope: apitype.ScopeRead, summary: "Get a sandbox", response: "Sandbox", okStatus: 200, params: []param{pID}, timeout: reqTimeout, h: s.getSandbox},
		{method: "DELETE", path: "/v1/sandboxes/{id}", scope: apitype.ScopeAdmin, summary: "Delete a sandbox (idempotent: 204 also when already gone); with egress_log=true answer 200 with its whole egress record", okStatus: 204, params: []param{pID, pDeleteEgressLog}, timeout: deleteTimeout, h: s.deleteSandbox},
		{method: "POST", path: "/v1/sandboxes/{id}/extend", scope: apitype.ScopeAdmin, summary: "Set the sandbox's expiry to now plus a TTL", request: "ExtendRequest", response: "Sandbox", okStatus: 200, params: []param{pID}, timeout: reqTimeout, h: s.extendSandbox},
		{method: "GET", path: "/v1/sandboxes/{id}/egress", scope: apitype.ScopeRead, summary: "The sandbox's egress policy and its recent denials", response: "EgressStatus", okStatus: 200, params: []param{pID}, timeout: reqTimeout, h: s.getEgress},
		{method: "PUT", path: "/v1/sandboxes/{id}/egress", scope: apitype.ScopeAdmin, summary: "Replace the sandbox's egress policy; enforced when the call returns", request: "EgressPolicy", response: "EgressStatus", okStatus: 200, params: []param{pID}, timeout: reqTimeout, h: s.putEgress},
		{method: "GET", path: "/v1/sandboxes/{id}/egress/log", scope: apitype.ScopeRead, summary: "The sandbox's egress record: the DNS questions its guests asked the node's resolver and the connections its proxy handled, with verdicts and bytes, oldest first; Accept: application/x-ndjson streams EgressRecord lines", response: "EgressLog", okStatus: 200, params: []param{pID, pLogType, pLogVM, pLogSince, pLogLimit}, timeout: reqTimeout, h: s.getEgressLog},
		{method: "POST", path: "/v1/sandboxes/{id}/check", scope: apitype.ScopeExec, summary: "Run the containment check from a VM or container of the sandbox", request: "CheckRequest", response: "CheckReport", okStatus: 200, params: []param{pID}, timeout: vmOpTimeout, h: s.check},
		{method: "POST", path: "/v1/sandboxes/{id}/vms/{vm}/exec", scope: apitype.ScopeExec, summary: "Run a command; Accept: application/x-ndjson streams ExecEvent records", request: "ExecRequest", response: "ExecResult", okStatus: 200, params: []param{pID, pVM}, timeout: execTimeout, h: s.exec},
		{method: "GET", path: "/v1/sandboxes/{id}/vms/{vm}/files", scope: apitype.ScopeExec, summary: "Read a guest file (raw bytes)", responseType: "application/octet-stream", okStatus: 200, params: []param{pID, pVM, pPath}, timeout: fileTimeout, h: s.readFile},
		{method: "PUT", path: "/v1/sandboxes/{id}/vms/{vm}/files", scope: apitype.ScopeExec, summary: "Write a guest file (raw bytes)", requestType: "application/octet-stream", okStatus: 204, params: []param{pID, pVM, pPath, pMode}, timeout: fileTimeout, h: s.writeFile},
		{method: "POST", path: "/v1/sandboxes/{id}/vms/{vm}/snapshots", scope: apitype.ScopeExec, summary: "Snapshot a VM", request: "SnapshotRequest", okStatus: 204, params: []param{pID, pVM}, timeout: vmOpTimeout, h: s.snapshot},
		{method: "POST", path: "/v1/sandboxes/{id}/vms/{vm}/snapshots/{name}/rollback", scope: apitype.ScopeExec, summary: "Roll a VM back to a snapshot", okStatus: 204, params: []param{pID, pVM, pName}, timeout: vmOpTimeout, h: s.rollback},
		s.eventsRoute(),
	}, s.templateRoutes()...)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request, _ principal) error {
	return writeJSON(w, http.StatusOK, apitype.Health{Status: "ok", Node: s.e.Node(), Sandboxes: len(s.e.List()),
		DefaultTTLSeconds: int64(s.o.DefaultTTL / time.Second), MaxTTLSeconds: int64(s.o.MaxTTL / time.Second),
		TemplateBuilds: s.templateBuildsOn()})
}

// capacity answers the guard's room: the node's, narrowed to what the
// caller's owner caps still admit (an owner-bound token's owner, else the
// owner "-" of sandboxes created without one), since that is the room its
// creates will find; no sandbox, owner or label of anyone else is in it.
func (s *Server) capacity(w http.ResponseWriter, r *http.Request, p principal) error {
	c := s.e.CapacityFor(p.owner, true)
	c.FreeSandboxes = c.Fits(apitype.CapacityUse{VMs: 1, VCPUs: minCores, MemoryMiB: minMemoryMiB})
	return writeJSON(w, http.StatusOK, c)
}

// parseMode parses the mode query parameter ("": 0644).
func parseMode(ms string) (os.FileMode, *apitype.Problem) {
	if ms == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(ms, 8, 32)
	if err != nil || v > 0o777 {
		return 0, invalid("mode", "mode %q: want octal permission bits up to 0777", ms)
	}
	return os.FileMode(v), nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	var req apitype.CreateRequest
	if pr := decodeJSON(w, r, maxJSONBody, &req); pr != nil {
		return pr
	}
	if pr := validateCreate(&req, int64(s.o.DefaultTTL/time.Second), int64(s.o.MaxTTL/time.Second)); pr != nil {
		return pr
	}
	if err := s.e.ValidateEgress(req.Egress); err != nil {
		return err
	}
	switch {
	case p.owner != "" && req.Owner != "" && req.Owner != p.owner:
		return invalid("owner", "this token is bound to owner %q and creates sandboxes only for it", p.owner)
	case p.owner != "":
		req.Owner = p.owner
	case req.Owner == "":
		req.Owner = p.name
	}
	sb, err := s.e.Create(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	return writeJSON(w, http.StatusCreated, sb)
}

// validateSandbox answers what a create of the body would be refused for
// on this node, with the node's templates. A body the create's own rules
// refuse (it does not decode, or breaks a rule of the request alone) is
// refused as the create would refuse it, invalid-request (400).
func (s *Server) validateSandbox(w http.ResponseWriter, r *http.Request, _ principal) error {
	var req apitype.CreateRequest
	if pr := decodeJSON(w, r, maxJSONBody, &req); pr != nil {
		return pr
	}
	if pr := validateCreate(&req, int64(s.o.DefaultTTL/time.Second), int64(s.o.MaxTTL/time.Second)); pr != nil {
		return pr
	}
	rep := apitype.ValidateReport{Problems: []apitype.Problem{}}
	refusals, templates, err := s.e.Validate(r.Context(), req)
	if err != nil {
		return err
	}
	for _, e := range refusals {
		rep.Problems = append(rep.Problems, *asProblem(e))
	}
	rep.Templates = templates
	if rep.Templates == nil {
		rep.Templates = []string{}
	}
	rep.Valid = len(rep.Problems) == 0
	return writeJSON(w, http.StatusOK, rep)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p principal) error {
	out := []apitype.Sandbox{}
	for _, sb := range s.e.List() {
		if p.sees(sb) {
			out = append(out, sb)
		}
	}
	return writeJSON(w, http.StatusOK, apitype.SandboxList{Sandboxes: out})
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request, _ principal) error {
	return writeJSON(w, http.StatusOK, s.e.Pool())
}

// lookup finds a sandbox p may see; another owner's is not found.
func (s *Server) lookup(p principal, id string) (apitype.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return apitype.Sandbox{}, problemf(apitype.ProblemNotFound, "sandbox %q not found", id)
	}
	sb, ok := s.e.Get(id)
	if !ok || !p.sees(sb) {
		return apitype.Sandbox{}, problemf(apitype.ProblemNotFound, "sandbox %q not found", id)
	}
	return sb, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.lookup(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	keep, err := egressLogParam(r)
	if err != nil {
		return err
	}
	if keep {
		return s.deleteKeepingEgress(w, r, p)
	}
	id := r.PathValue("id")
	if sandbox.ValidID(id) {
		if sb, ok := s.e.Get(id); ok && !p.sees(sb) {
			return problemf(apitype.ProblemNotFound, "sandbox %q not found", id)
		}
		if err := s.e.DeleteBy(r.Context(), id, p.who()); err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) extendSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	if _, err := s.lookup(p, r.PathValue("id")); err != nil {
		return err
	}
	var req apitype.ExtendRequest
	if pr := decodeJSON(w, r, maxJSONBody, &req); pr != nil {
		return pr
	}
	if pr := validateExtend(&req, int64(s.o.MaxTTL/time.Second)); pr != nil {
		return pr
	}
	sb, err := s.e.Extend(r.PathValue("id"), time.Duration(req.TTLSeconds)*time.Second)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

// ownerOf is the owner of the sandbox {id} (begun already): the owner
// whose quotas a guest I/O call takes.
func (s *Server) ownerOf(r *http.Request) string {
	sb, _ := s.e.Get(r.PathValue("id"))
	return sb.Owner
}

// begin resolves {id} and {vm} to a ready sandbox's VM and starts an
// operation on it: ctx is cancelled when the sandbox is deleted, and end
// must be called with the handler's result.
func (s *Server) begin(r *http.Request, p principal) (apitype.VM, context.Context, func(error) error, error) {
	id := r.PathValue("id")
	if _, err := s.lookup(p, id); err != nil {
		return apitype.VM{}, nil, nil, err
	}
	_, vm, ctx, end, err := s.e.Begin(r.Context(), id, r.PathValue("vm"))
	return vm, ctx, end, err
}

func (s *Server) toGuestExec(e apitype.ExecRequest) sandbox.GuestExec {
	t := e.TimeoutSeconds
	if t == 0 {
		t = int64(s.o.ExecTimeout / time.Second)
	}
	lim := e.OutputLimit
	if lim == 0 {
		lim = 10 << 20
	}
	return sandbox.GuestExec{Argv: e.Argv, Stdin: e.Stdin, Cwd: e.Cwd, Env: e.Env, User: e.User, Timeout: t, OutputLimit: lim}
}

func wantsNDJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err == nil && mt == "application/x-ndjson" {
			return true
		}
	}
	return false
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, p principal) (err error) {
	vm, octx, end, err := s.beginGuest(r, p)
	if err != nil {
		return err
	}
	defer func() { err = end(err) }()
	guard := s.guardClient(octx, w)
	defer guard.stop()
	var req apitype.ExecRequest
	if pr := decodeJSON(w, r, maxExecBody, &req); pr != nil {
		return pr
	}
	win := hardening.IsWindows(vm.OSType)
	if pr := validateExec(&req, win); pr != nil {
		return pr
	}
	stream := wantsNDJSON(r)
	if !stream && req.OutputLimit > maxCollected {
		return invalid("output_limit", "output_limit %d: output collected into one answer is capped at %d bytes per stream; ask with Accept: application/x-ndjson to stream more", req.OutputLimit, maxCollected)
	}
	owner := s.ownerOf(r)
	release, err := s.execs.take(owner, 1)
	if err != nil {
		return err
	}
	defer release()
	ge := s.toGuestExec(req)
	ctx, cancel := context.WithTimeout(sandbox.WithOwner(octx, owner), time.Duration(ge.Timeout)*time.Second+30*time.Second)
	defer cancel()
	g := s.e.Guest(vm.VMID)
	w = guard.writer(w)
	if !stream || win {
		unreserve, err := s.reserveCollected(owner, ge.OutputLimit, win)
		if err != nil {
			return err
		}
		defer unreserve()
	}
	if !stream {
		res, err := g.Exec(ctx, ge)
		if err != nil {
			return s.guestRefusal(owner, err)
		}
		return writeJSON(w, http.StatusOK, res)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	sw := &ndjsonWriter{w: w}
	res, err := g.ExecStream(ctx, ge, sw.stream("stdout"), sw.stream("stderr"))
	if err != nil {
		pr := asProblem(s.guestRefusal(owner, err))
		if strings.HasPrefix(pr.Type, "guest-agent") || pr.Type == apitype.ProblemGuestTimeout {
			s.met.guestErrors.WithLabelValues(pr.Type).Inc()
		}
		return sw.event(apitype.ExecEvent{Type: "error", Problem: pr})
	}
	res.Stdout, res.Stderr = nil, nil
	return sw.event(apitype.ExecEvent{Type: "exit", Result: res})
}

// winAgentOutputCap is the most of each stream the Windows agent
// collects (GUEST_EXEC_MAX_OUTPUT in QEMU's qga/commands.c).
const winAgentOutputCap = 16 << 20

// reserveCollected reserves the output an exec holds in the daemon before
// it is written: twice its output limit (stdout and stderr). A Windows
// VM's exec is collected even when streamed (its agent hands the output
// over only at exit, qga/windows.go), and holds at most the agent's cap
// of each stream. An exec that could never fit the owner's share is
// refused for good (400).
func (s *Server) reserveCollected(owner string, limit int64, win bool) (func(), error) {
	held := limit
	if win {
		held = min(limit, winAgentOutputCap)
	}
	if most := s.collected.share + s.collected.spare(); 2*held > most {
		if win {
			return nil, invalid("output_limit", "output_limit %d: an exec in a Windows VM is collected before it is written, streamed or not, and reserves twice its output limit (at most %d per stream, the agent's cap); an owner's share of the collected output is %d bytes (owner_collected_bytes): ask for at most %d", limit, winAgentOutputCap, most, most/2)
		}
		return nil, invalid("output_limit", "output_limit %d: a collected exec reserves twice its output limit, and an owner's share of the collected output is %d bytes (owner_collected_bytes); ask for at most %d or ask with Accept: application/x-ndjson to stream", limit, most, most/2)
	}
	return s.collected.take(owner, 2*held)
}

// ndjsonWriter writes ExecEvent records, one per line, flushing each.
type ndjsonWriter struct {
	w  http.ResponseWriter
	mu sync.Mutex
}

func (n *ndjsonWriter) event(e apitype.ExecEvent) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, err := n.w.Write(b); err != nil {
		return err
	}
	if f, ok := n.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

type streamWriter struct {
	n   *ndjsonWriter
	typ string
}

func (s streamWriter) Write(p []byte) (int, error) {
	const chunk = 64 << 10
	for off := 0; off < len(p); off += chunk {
		end := min(off+chunk, len(p))
		if err := s.n.event(apitype.ExecEvent{Type: s.typ, Data: p[off:end]}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func (n *ndjsonWriter) stream(typ string) io.Writer {
	return streamWriter{n: n, typ: typ}
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, p principal) (err error) {
	vm, ctx, end, err := s.beginGuest(r, p)
	if err != nil {
		return err
	}
	defer func() { err = end(err) }()
	guard := s.guardClient(ctx, w)
	defer guard.stop()
	w = guard.writer(w)
	path, pr := guestPath(r.URL.Query().Get("path"), false, hardening.IsWindows(vm.OSType))
	if pr != nil {
		return pr
	}
	owner := s.ownerOf(r)
	release, err := s.files.take(owner, 1)
	if err != nil {
		return err
	}
	defer release()
	ctx = sandbox.WithOwner(ctx, owner)
	defer func() { err = s.guestRefusal(owner, err) }() // before end
	if g, ok := s.e.Guest(vm.VMID).(sizedReader); ok {
		return s.streamFile(ctx, w, vm.VMID, g, path)
	}
	if err := os.MkdirAll(s.o.SpoolDir, 0o700); err != nil {
		return fmt.Errorf("spool dir: %w", err)
	}
	f, err := os.CreateTemp(s.o.SpoolDir, "pve-inspectd-read-*")
	if err != nil {
		return fmt.Errorf("spool file: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	sp := &spoolWriter{w: f, total: &s.spooled, max: s.o.SpoolBytes}
	defer sp.release()
	n, err := s.e.Guest(vm.VMID).ReadFile(ctx, path, sp, s.o.MaxFileBytes)
	if err != nil {
		if errors.Is(err, errSpoolFull) {
			return problemf(apitype.ProblemUnavailable, "the spool for file reads is full (%d bytes in flight); retry later", s.o.SpoolBytes)
		}
		if errors.Is(err, sandbox.ErrTooLarge) {
			return problemf(apitype.ProblemOutputLimit, "%s is larger than the cap of %d bytes", path, s.o.MaxFileBytes)
		}
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("spool file: %w", err)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	_, err = io.Copy(w, io.LimitReader(f, n))
	return err
}

// errSpoolFull: the spool's total cap would be passed.
var errSpoolFull = errors.New("spool full")

// spoolWriter counts what one read spools against the total of every read
// in flight and refuses to pass max.
type spoolWriter struct {
	w     io.Writer
	total *atomic.Int64
	max   int64
	n     int64
}

func (s *spoolWriter) Write(p []byte) (int, error) {
	if s.total.Add(int64(len(p))) > s.max {
		s.total.Add(-int64(len(p)))
		return 0, errSpoolFull
	}
	s.n += int64(len(p))
	n, err := s.w.Write(p)
	return n, err
}

// release gives the spooled bytes back to the total.
func (s *spoolWriter) release() { s.total.Add(-s.n); s.n = 0 }

// limitedBody turns the body's MaxBytesError into a problem.
type limitedBody struct {
	r   io.Reader
	max int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return n, problemf(apitype.ProblemPayloadTooLarge, "body is over the cap of %d bytes", l.max)
	}
	return n, err
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, p principal) (err error) {
	vm, ctx, end, err := s.beginGuest(r, p)
	if err != nil {
		return err
	}
	defer func() { err = end(err) }()
	guard := s.guardClient(ctx, w)
	defer guard.stop()
	owner := s.ownerOf(r)
	release, err := s.files.take(owner, 1)
	if err != nil {
		return err
	}
	defer release()
	ctx = sandbox.WithOwner(ctx, owner)
	defer func() { err = s.guestRefusal(owner, err) }() // before end
	q := r.URL.Query()
	path, pr := guestPath(q.Get("path"), true, hardening.IsWindows(vm.OSType))
	if pr != nil {
		return pr
	}
	mode, pr := parseMode(q.Get("mode"))
	if pr != nil {
		return pr
	}
	if r.ContentLength > s.o.MaxFileBytes {
		return problemf(apitype.ProblemPayloadTooLarge, "body of %d bytes is over the cap of %d", r.ContentLength, s.o.MaxFileBytes)
	}
	body := &limitedBody{r: guard.body(http.MaxBytesReader(w, r.Body, s.o.MaxFileBytes)), max: s.o.MaxFileBytes}
	if err := s.e.Upload(ctx, vm.VMID, path, body, r.ContentLength, mode); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, p principal) (err error) {
	// The body is read before the operation begins: a delete waits for
	// the sandbox's operations, and a client that trickles its body would
	// hold it until the request's read deadline.
	if _, err := s.lookup(p, r.PathValue("id")); err != nil {
		return err
	}
	var req apitype.SnapshotRequest
	if pr := decodeJSON(w, r, maxJSONBody, &req); pr != nil {
		return pr
	}
	if pr := validateSnapshotName(req.Name); pr != nil {
		return pr
	}
	vm, ctx, end, err := s.begin(r, p)
	if err != nil {
		return err
	}
	defer func() { err = end(err) }()
	if err := s.e.Snapshot(ctx, vm.VMID, req.Name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request, p principal) (err error) {
	vm, ctx, end, err := s.begin(r, p)
	if err != nil {
		return err
	}
	defer func() { err = end(err) }()
	name := r.PathValue("name")
	if pr := validateSnapshotName(name); pr != nil {
		return pr
	}
	if err := s.e.Rollback(ctx, vm.VMID, name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) check(w http.ResponseWriter, r *http.Request, p principal) (err error) {
	if _, err := s.lookup(p, r.PathValue("id")); err != nil {
		return err
	}
	var req apitype.CheckRequest
	if r.ContentLength != 0 {
		if pr := decodeJSON(w, r, maxJSONBody, &req); pr != nil {
			return pr
		}
	}
	if req.VM == "" {
		// the first member the check can run in (a Linux VM with a
		// guest agent, or a container): a sandbox whose first VM has no
		// agent, as a CTF's target listed first, runs Windows, has no
		// NIC or its first NIC on a shared vnet, is checked from the
		// next
		req.VM = s.e.FirstCheckVM(r.PathValue("id"))
	}
	if err := s.e.Broken(r.PathValue("id"), req.VM); err != nil {
		return err
	}
	rep, err := s.runCheck(r, req.VM)
	if err != nil {
		return err
	}
	// the report is written after the operation has ended: a client that
	// never reads it holds its own connection, not the sandbox (a delete
	// does not wait for it)
	return writeJSON(w, http.StatusOK, rep)
}

// runCheck runs the containment check of sandbox {id}'s VM vm inside one
// operation, which has ended when it returns.
func (s *Server) runCheck(r *http.Request, vmName string) (rep apitype.CheckReport, err error) {
	sb, vm, ctx, end, err := s.e.Begin(r.Context(), r.PathValue("id"), vmName)
	if err != nil {
		return rep, err
	}
	defer func() { err = end(err) }()
	if err := sandbox.CheckIO(vm); err != nil {
		return rep, err // the probe is a Linux program
	}
	// the check runs the probe through the VM's agent: a guest call of
	// the sandbox's owner, holding one of its exec slots and charged to
	// its share of the agent's reply buffers
	release, err := s.execs.take(sb.Owner, 1)
	if err != nil {
		return rep, err
	}
	defer release()
	rep, err = s.e.Check(sandbox.WithOwner(ctx, sb.Owner), sb, vm)
	if err != nil {
		return rep, s.guestRefusal(sb.Owner, err)
	}
	return rep, nil
}
