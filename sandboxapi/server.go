package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TokenVerifier checks a bearer token and returns its name and scopes.
// Implemented by sandboxapi/auth.Store.
type TokenVerifier interface {
	Verify(token string) (name string, scopes []string, err error)
}

// OwnerVerifier is a TokenVerifier whose tokens may be bound to an owner
// (auth.Store): a bound token sees and touches only that owner's
// sandboxes, and creates sandboxes for it.
type OwnerVerifier interface {
	VerifyOwner(token string) (name string, scopes []string, owner string, err error)
}

// Options configure a Server. Zero values take the documented defaults.
// The engine's own options (node, Proxmox, guests, caps, ...) are
// sandbox.Options.
type Options struct {
	// Tokens verifies bearer tokens on Handler; nil refuses every token.
	Tokens TokenVerifier
	// SpoolDir holds guest file reads while they are checked against the
	// cap (default <engine StateDir>/spool, created 0700); SpoolBytes caps
	// the bytes spooled by every read in flight together (4 GiB): a read
	// that would pass it answers unavailable.
	SpoolDir   string
	SpoolBytes int64
	// MaxExecs and MaxFileCalls cap the exec calls (streamed or not) and
	// the file reads and writes in flight on the node (32 and 8); calls
	// beyond them answer unavailable (503, Retry-After).
	MaxExecs, MaxFileCalls int
	// CollectedBytes caps the output all collected (non-streamed) execs in
	// flight may hold together (256 MiB): each reserves twice its output
	// limit (stdout and stderr) and answers unavailable when that would
	// pass the cap. With the call caps it bounds the daemon's memory (the
	// unit's MemoryMax).
	CollectedBytes int64
	// OwnerExecs, OwnerFileCalls and OwnerCollectedBytes are each owner's
	// share of those (8, 2 and 64 MiB: a quarter of the node's, so four
	// owners at their full share fit). The owner of a call is the owner of
	// the sandbox it targets. A call past its owner's share answers
	// too-many-requests (429, Retry-After); while fewer than node/share
	// owners hold some of a resource, every owner arriving finds its whole
	// share (quota.go: nobody holds past its share but of the collected
	// bytes' node total mod share).
	OwnerExecs, OwnerFileCalls int
	OwnerCollectedBytes        int64
	// DefaultTTL (1h) and MaxTTL (24h) bound sandbox lifetimes.
	DefaultTTL, MaxTTL time.Duration
	// MaxFileBytes caps file uploads and downloads (1 GiB).
	MaxFileBytes int64
	// RequestTimeout bounds every call except create, delete, check,
	// snapshots, exec and files (60s); those take the engine's create and
	// teardown timeouts, ExecTimeout and FileTimeout.
	RequestTimeout time.Duration
	// ExecTimeout is the default exec timeout (10m); the call's deadline is
	// the exec timeout plus 30s.
	ExecTimeout time.Duration
	// FileTimeout bounds one file transfer (30m).
	FileTimeout time.Duration
	// TemplateUploadTimeout bounds an image upload for a template build
	// (PUT /v1/templates/build/{name}/image; 4h); TemplateUploadIdle how
	// long its body may send nothing (2m): a stalled client gives its
	// upload slot back then, not at the timeout.
	TemplateUploadTimeout, TemplateUploadIdle time.Duration
	// Streams caps the GET /v1/events streams and bounds their writes
	// (eventstreams.go).
	Streams StreamLimits
	// Templates builds templates on request (POST /v1/templates/build);
	// nil: builds are off and those routes answer forbidden, saying how
	// to turn them on.
	Templates TemplateBuilder
	// TemplateCatalog answers GET /v1/templates/{name} (nil: that route
	// answers unavailable).
	TemplateCatalog TemplateCatalog
	// Registerer receives the request metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Logger is the structured logger (slog.Default()).
	Logger *slog.Logger
}

func (o *Options) defaults(eo sandbox.Options) error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if o.SpoolDir == "" {
		o.SpoolDir = filepath.Join(eo.StateDir, "spool")
	}
	if o.SpoolBytes == 0 {
		o.SpoolBytes = 4 << 30
	}
	orDefault(&o.MaxExecs, 32)
	orDefault(&o.MaxFileCalls, 8)
	orDefault(&o.CollectedBytes, 256<<20)
	orDefault(&o.OwnerExecs, 8)
	orDefault(&o.OwnerFileCalls, 2)
	orDefault(&o.OwnerCollectedBytes, 64<<20)
	if o.SpoolBytes < 0 || o.MaxExecs < 0 || o.MaxFileCalls < 0 || o.CollectedBytes < 0 ||
		o.OwnerExecs < 0 || o.OwnerFileCalls < 0 || o.OwnerCollectedBytes < 0 {
		return errors.New("sandboxapi: SpoolBytes, MaxExecs, MaxFileCalls, CollectedBytes and the owner shares must not be negative")
	}
	def(&o.DefaultTTL, time.Hour)
	def(&o.MaxTTL, 24*time.Hour)
	def(&o.RequestTimeout, time.Minute)
	def(&o.ExecTimeout, 10*time.Minute)
	def(&o.FileTimeout, 30*time.Minute)
	def(&o.TemplateUploadTimeout, 4*time.Hour)
	def(&o.TemplateUploadIdle, 2*time.Minute)
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = 1 << 30
	}
	if o.DefaultTTL > o.MaxTTL {
		return fmt.Errorf("sandboxapi: default TTL %s is over the max TTL %s", o.DefaultTTL, o.MaxTTL)
	}
	if err := o.Streams.defaults(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Logger = o.Logger.With("component", "sandboxapi")
	return nil
}

// orDefault sets *p to v when it is zero.
func orDefault[T int | int64](p *T, v T) {
	if *p == 0 {
		*p = v
	}
}

// Server is the sandbox API: HTTP handlers over the sandbox engine.
type Server struct {
	o Options
	// e is the engine; eo its options (the create and teardown timeouts
	// bound the routes).
	e      *sandbox.Engine
	eo     sandbox.Options
	met    *metrics
	routes []route
	mux    *http.ServeMux
	// literal holds the methods of each route path without a wildcard:
	// such a path is that route's, never a wildcard route's value (GET
	// /v1/templates/{name} would match /v1/templates/build), as OpenAPI
	// has a concrete path win over a templated one.
	literal map[string][]string
	// execs and files count the exec and file calls in flight, collected
	// the output the collected execs in flight have reserved, each per
	// owner and on the node (quota.go).
	execs, files, collected *quota
	// logReads counts the egress record reads in flight (each holds its
	// page until it is written), per owner and on the node.
	logReads *quota
	// spooled counts the bytes the file reads in flight have spooled.
	spooled atomic.Int64
	// streams counts the open event streams (eventstreams.go).
	streams *streamCount
	// uploads holds a token per image upload in flight (templates.go).
	uploads chan struct{}
}

// New builds a Server over the engine e. Call e.Reconcile before serving
// and run e.RunReaper.
func New(e *sandbox.Engine, o Options) (*Server, error) {
	if e == nil {
		return nil, errors.New("sandboxapi: an engine is required")
	}
	eo := e.Options()
	if err := o.defaults(eo); err != nil {
		return nil, err
	}
	met, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sandboxapi: register metrics: %w", err)
	}
	s := &Server{o: o, e: e, eo: eo, met: met,
		execs:     newQuota("exec-slots", "exec calls", int64(o.MaxExecs), int64(o.OwnerExecs), false, met),
		files:     newQuota("file-slots", "file calls", int64(o.MaxFileCalls), int64(o.OwnerFileCalls), false, met),
		collected: newQuota("collected-bytes", "bytes of collected exec output", o.CollectedBytes, o.OwnerCollectedBytes, true, met),
		logReads:  newQuota("egress-log-reads", "egress record reads", maxLogReads, ownerLogReads, false, met),
		streams:   newStreamCount(o.Streams),
		uploads:   make(chan struct{}, maxUploads)}
	s.routes = s.routeTable()
	s.mux = http.NewServeMux()
	s.literal = map[string][]string{}
	for _, rt := range s.routes {
		s.mux.Handle(rt.method+" "+rt.path, s.wrap(rt))
		if !strings.Contains(rt.path, "{") {
			s.literal[rt.path] = append(s.literal[rt.path], rt.method)
			if rt.method == http.MethodGet {
				s.literal[rt.path] = append(s.literal[rt.path], http.MethodHead)
			}
		}
	}
	return s, nil
}

// Engine returns the engine the server answers for.
func (s *Server) Engine() *sandbox.Engine { return s.e }

// principal is who is calling. owner, when set, confines the caller to
// that owner's sandboxes (an owner-bound token).
type principal struct {
	name   string
	scopes []string
	owner  string
	// local is set for a caller of the local socket (name "local").
	local bool
}

// who names p in a sentence: "token NAME" (with its owner when bound),
// or "a caller of the local socket".
func (p principal) who() string {
	if p.local {
		return "a caller of the local socket"
	}
	s := fmt.Sprintf("token %q", p.name)
	if p.owner != "" {
		s += fmt.Sprintf(" (owner %q)", p.owner)
	}
	return s
}

// sees reports whether p may see and touch sb.
func (p principal) sees(sb apitype.Sandbox) bool { return p.owner == "" || sb.Owner == p.owner }

type ctxKey int

const localKey ctxKey = 1

// Handler serves the API to callers that present a bearer token (the TCP
// listener).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

// serve dispatches to the mux and turns its plain-text 404/405 answers for
// unknown routes into problem documents.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if methods, ok := s.literal[r.URL.Path]; ok && !slices.Contains(methods, r.Method) {
		// a concrete path answers only its own methods, whatever
		// wildcard route would take its text as a value
		w.Header().Set("Allow", strings.Join(methods, ", "))
		writeProblem(w, problemf(apitype.ProblemMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		s.mux.ServeHTTP(w, r) // fills r.PathValue
		return
	}
	cw := &captureWriter{h: http.Header{}}
	h.ServeHTTP(cw, r)
	if allow := cw.h.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	if cw.code == http.StatusMethodNotAllowed {
		writeProblem(w, problemf(apitype.ProblemMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	writeProblem(w, problemf(apitype.ProblemNotFound, "no route %s %s", r.Method, r.URL.Path))
}

// captureWriter records the status of the mux's fallback answers.
type captureWriter struct {
	h    http.Header
	code int
}

func (c *captureWriter) Header() http.Header { return c.h }

func (c *captureWriter) Write(b []byte) (int, error) { return len(b), nil }

func (c *captureWriter) WriteHeader(code int) { c.code = code }

// LocalHandler serves the API to local callers whose access the unix
// socket's group and mode already decided: they act with the admin scope.
func (s *Server) LocalHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serve(w, r.WithContext(context.WithValue(r.Context(), localKey, true)))
	})
}

func (s *Server) authenticate(r *http.Request, need string) (principal, *apitype.Problem) {
	if r.Context().Value(localKey) == true {
		return principal{name: "local", scopes: []string{apitype.ScopeAdmin}, local: true}, nil
	}
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return principal{}, newProblem(apitype.ProblemUnauthorized, "a bearer token is required")
	}
	if s.o.Tokens == nil {
		return principal{}, newProblem(apitype.ProblemUnauthorized, "token authentication is not configured")
	}
	var (
		name, owner string
		scopes      []string
		err         error
	)
	if ov, ok := s.o.Tokens.(OwnerVerifier); ok {
		name, scopes, owner, err = ov.VerifyOwner(tok)
	} else {
		name, scopes, err = s.o.Tokens.Verify(tok)
	}
	if err != nil {
		return principal{}, newProblem(apitype.ProblemUnauthorized, "invalid token")
	}
	if !apitype.ScopeIncludes(scopes, need) {
		return principal{}, problemf(apitype.ProblemForbidden, "token %q lacks the %s scope", name, need)
	}
	return principal{name: name, scopes: scopes, owner: owner}, nil
}

// statusWriter records the status code for metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) {
	if w.code == 0 {
		w.code = c
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ReadFrom keeps net/http's own ReadFrom, which sends a file with
// sendfile(2) (large downloads).
func (w *statusWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, r)
}

// wrap adds authentication, the deadline, metrics and panic safety.
func (s *Server) wrap(rt route) http.Handler {
	pattern := rt.method + " " + rt.path
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				s.o.Logger.Error("handler panic", "route", pattern, "panic", v)
				if sw.code == 0 {
					writeProblem(sw, newProblem(apitype.ProblemInternal, "internal error"))
				}
			}
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			s.met.requests.WithLabelValues(pattern, strconv.Itoa(code)).Inc()
			s.met.latency.WithLabelValues(pattern).Observe(time.Since(start).Seconds())
		}()
		timeout := rt.timeout(s)
		r = s.setDeadlines(sw, r, rt, timeout)
		p, prob := s.authenticate(r, rt.scope)
		if prob != nil {
			if prob.Type == apitype.ProblemUnauthorized {
				sw.Header().Set("WWW-Authenticate", `Bearer realm="pve-inspectd"`)
			}
			// The body stays unread: close the connection instead of
			// letting the server wait to drain it for the next request.
			sw.Header().Set("Connection", "close")
			_ = http.NewResponseController(sw).SetReadDeadline(time.Now())
			writeProblem(sw, prob)
			return
		}
		if rt.node && p.owner != "" {
			sw.Header().Set("Connection", "close")
			_ = http.NewResponseController(sw).SetReadDeadline(time.Now())
			writeProblem(sw, problemf(apitype.ProblemForbidden, "%s is bound to an owner: %s %s is a node operation, for an unbound admin token or the node's local socket", p.who(), rt.method, rt.path))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		if err := rt.h(sw, r.WithContext(ctx), p); err != nil {
			pr := asProblem(err)
			if strings.HasPrefix(pr.Type, "guest-agent") || pr.Type == apitype.ProblemGuestTimeout {
				s.met.guestErrors.WithLabelValues(pr.Type).Inc()
			}
			if sw.code != 0 {
				s.o.Logger.Warn("error after response started", "route", pattern, "err", err)
				return
			}
			setRetryAfter(sw.Header(), err)
			writeProblem(sw, pr)
		}
	})
}

// setDeadlines bounds how long the request body may take to arrive and the
// answer to be written: a JSON body within RequestTimeout, a file upload
// within the route's timeout; the answer within the route's timeout plus a
// margin to write the problem of a call that ran out of time. A client that
// sends its body slowly is cut at the deadline.
//
// Once the body is read to its end (at once for a request without one),
// the read deadline moves to the answer's: net/http then reads the
// connection in the background to see the client go, and a read that
// times out there cancels the request's context, so a body deadline left
// in force cancelled every call still running when it passed (a delete
// waiting for another past RequestTimeout answered 500 "context
// canceled"). It returns r with its body so watched.
func (s *Server) setDeadlines(w http.ResponseWriter, r *http.Request, rt route, timeout time.Duration) *http.Request {
	now := time.Now()
	read := min(timeout, s.o.RequestTimeout)
	if rt.requestType != "" { // raw uploads
		read = timeout
	}
	end := now.Add(timeout + 30*time.Second)
	rc := http.NewResponseController(w)
	setRead := func(at time.Time) {
		if err := rc.SetReadDeadline(at); err != nil && !errors.Is(err, http.ErrNotSupported) {
			s.o.Logger.Warn("set read deadline", "err", err)
		}
	}
	if r.Body == nil || r.Body == http.NoBody {
		setRead(end)
	} else {
		setRead(now.Add(read))
		r = r.Clone(r.Context())
		r.Body = &bodyEnd{ReadCloser: r.Body, atEOF: func() { setRead(end) }}
	}
	if err := rc.SetWriteDeadline(end); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.o.Logger.Warn("set write deadline", "err", err)
	}
	return r
}

// bodyEnd calls atEOF once, when its body has been read to its end.
type bodyEnd struct {
	io.ReadCloser
	atEOF func()
	done  bool
}

func (b *bodyEnd) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.atEOF()
	}
	return n, err
}

// writeJSON sends a JSON document.
func writeJSON(w http.ResponseWriter, code int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	return json.NewEncoder(w).Encode(v)
}

var _ io.Writer = (*statusWriter)(nil)

// Routes lists the served routes as "METHOD /path" patterns.
func (s *Server) Routes() []string {
	out := make([]string, len(s.routes))
	for i, rt := range s.routes {
		out[i] = rt.method + " " + rt.path
	}
	return out
}
