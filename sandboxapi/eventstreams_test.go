package sandboxapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
)

// stream is an open GET /v1/events (or its refusal).
type stream struct {
	resp   *http.Response
	cancel context.CancelFunc
}

func (s stream) close() { s.cancel(); s.resp.Body.Close() }

// openStream opens GET /v1/events?query with token tok on the TCP
// listener and returns once the answer's head is in.
func openStream(t *testing.T, e *env, tok, query string) stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", e.tcp.URL+"/v1/events"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := stream{resp: resp, cancel: cancel}
	t.Cleanup(s.close)
	return s
}

// problemOf decodes a refusal.
func problemOf(t *testing.T, resp *http.Response) apitype.Problem {
	t.Helper()
	var p apitype.Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("%d answer is no problem document: %v", resp.StatusCode, err)
	}
	return p
}

// TestEventStreamCaps: streams are capped per token, per owner (every
// token bound to it together) and per node; a stream past a cap is a 429
// too-many-requests naming the cap, with Retry-After, counted per owner in
// pve_inspect_api_quota_refusals_total; a closed stream gives its slot
// back. Before, any token could open any number of streams.
func TestEventStreamCaps(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.Streams = sandboxapi.StreamLimits{PerToken: 2, PerOwner: 3, Node: 6}
	})
	mint := func(name, owner string) string {
		var (
			tok string
			err error
		)
		if owner == "" {
			tok, _, err = store.Create(name, []string{"read"}, time.Now())
		} else {
			tok, _, err = store.CreateOwned(name, owner, []string{"read"}, time.Now())
		}
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	a1, a2, b1, c1, root := mint("a1", "alice"), mint("a2", "alice"), mint("b1", "bob"), mint("c1", "carol"), mint("root", "")
	open := map[string]stream{}
	for _, tc := range []struct {
		name, tok string
		ok        bool
		cap       string // in the refusal's detail
		owner     string // the refusal's owner label
	}{
		{"alice's first token, first stream", a1, true, "", ""},
		{"alice's first token, second stream", a1, true, "", ""},
		{"alice's first token past its cap", a1, false, `token "a1"`, "alice"},
		{"alice's second token", a2, true, "", ""},
		{"alice's second token past alice's cap", a2, false, `owner "alice"`, "alice"},
		{"bob", b1, true, "", ""},
		{"bob again", b1, true, "", ""},
		{"an unbound token", root, true, "", ""},
		{"carol past the node's cap", c1, false, "this node", "carol"},
	} {
		s := openStream(t, e, tc.tok, "")
		open[tc.name] = s
		if tc.ok {
			if s.resp.StatusCode != http.StatusOK || s.resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%s: %d %s", tc.name, s.resp.StatusCode, s.resp.Header.Get("Content-Type"))
			}
			continue
		}
		p := problemOf(t, s.resp)
		if s.resp.StatusCode != http.StatusTooManyRequests || p.Type != apitype.ProblemTooManyRequests || !strings.Contains(p.Detail, tc.cap) || p.Quota != "event-streams" ||
			s.resp.Header.Get("Retry-After") != "10" {
			t.Errorf("%s: %d %+v Retry-After %q, want 429 too-many-requests naming %s with Retry-After 10", tc.name, s.resp.StatusCode, p, s.resp.Header.Get("Retry-After"), tc.cap)
		}
		if n := e.metric("pve_inspect_api_quota_refusals_total", "owner", tc.owner, "quota", "event-streams"); n < 1 {
			t.Errorf("%s: refusals of %s counted %v", tc.name, tc.owner, n)
		}
	}
	if n := e.metric("pve_inspect_api_quota_refusals_total", "owner", "alice", "quota", "event-streams"); n != 2 {
		t.Errorf("alice's refusals counted %v, want 2", n)
	}
	// a closed stream's slot is free again once the handler sees the
	// client go
	open["an unbound token"].close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s := openStream(t, e, c1, "")
		if s.resp.StatusCode == http.StatusOK {
			break
		}
		s.close()
		if time.Now().After(deadline) {
			t.Fatalf("carol still refused 5s after a stream closed: %d", s.resp.StatusCode)
		}
	}
}

// TestEventFilterBound: each filter list takes at most 256 items, repeated
// or comma-separated; one more is an invalid-request naming the bound and
// the parameter, and so is an item that is not a sandbox id or event type.
// Before, a stream could ask for any number (issue 34: ~7000 each).
func TestEventFilterBound(t *testing.T) {
	e := newEnv(t, nil)
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("sb%06d", i)
		}
		return out
	}
	repeated := func(name string, vals []string) string {
		q := url.Values{name: vals}
		return "?" + q.Encode()
	}
	for _, tc := range []struct {
		name, query string
		field       string // "" = accepted
		detail      string
	}{
		{"256 ids, comma-separated", "?sandbox=" + strings.Join(ids(256), ","), "", ""},
		{"256 ids, repeated", repeated("sandbox", ids(256)), "", ""},
		{"257 ids, comma-separated", "?sandbox=" + strings.Join(ids(257), ","), "sandbox", "256"},
		{"257 ids, mixed", repeated("sandbox", []string{strings.Join(ids(200), ","), strings.Join(ids(57), ",")}), "sandbox", "256"},
		{"7000 ids", "?sandbox=" + strings.Join(ids(7000), ","), "sandbox", "256"},
		{"empty items do not count", "?sandbox=" + strings.Repeat(",", 1000) + "sb000001", "", ""},
		{"not a sandbox id", "?sandbox=sb000001,../etc", "sandbox", "not a sandbox id"},
		{"257 types", "?type=" + strings.Repeat("health,", 257), "type", "256"},
		{"unknown type", "?type=health,nonsense", "type", "unknown event type"},
	} {
		s := openStream(t, e, "r", tc.query)
		if tc.field == "" {
			if s.resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %d %+v", tc.name, s.resp.StatusCode, problemOf(t, s.resp))
			}
			s.close()
			continue
		}
		p := problemOf(t, s.resp)
		if s.resp.StatusCode != http.StatusBadRequest || p.Type != apitype.ProblemInvalidRequest || p.Field != tc.field || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("%s: %d %+v, want invalid-request on %s saying %q", tc.name, s.resp.StatusCode, p, tc.field, tc.detail)
		}
	}
}

// TestOpenAPIEventsDeclared: the document says the filters' bound and
// declares the 429 (with Retry-After) and the 400 of GET /v1/events.
func TestOpenAPIEventsDeclared(t *testing.T) {
	e := newEnv(t, nil)
	doc, err := e.c.OpenAPI(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	op := doc["paths"].(map[string]any)["/v1/events"].(map[string]any)["get"].(map[string]any)
	responses := op["responses"].(map[string]any)
	tooMany, ok := responses["429"].(map[string]any)
	if !ok || tooMany["headers"].(map[string]any)["Retry-After"] == nil || !strings.Contains(fmt.Sprint(tooMany["content"]), apitype.ProblemTooManyRequests) {
		t.Errorf("429 of GET /v1/events: %v", responses["429"])
	}
	if _, ok := responses["400"]; !ok {
		t.Error("no 400 declared")
	}
	for _, p := range op["parameters"].([]any) {
		pm := p.(map[string]any)
		if pm["name"] == "sandbox" || pm["name"] == "type" {
			if max := pm["schema"].(map[string]any)["maxItems"]; fmt.Sprint(max) != "256" {
				t.Errorf("%s: maxItems %v", pm["name"], max)
			}
		}
	}
}

// stuckWriter is a client that takes the stream's opening line and then
// nothing: every later write blocks until the write deadline the handler
// set passes, as a socket whose peer stopped reading does.
type stuckWriter struct {
	h        http.Header
	mu       sync.Mutex
	writes   int
	deadline time.Time
}

func (w *stuckWriter) Header() http.Header { return w.h }

func (w *stuckWriter) WriteHeader(int) {}

func (w *stuckWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	first := w.writes == 1
	w.mu.Unlock()
	if first {
		return len(b), nil
	}
	for {
		w.mu.Lock()
		d := w.deadline
		w.mu.Unlock()
		if !d.IsZero() && time.Now().After(d) {
			return 0, os.ErrDeadlineExceeded
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *stuckWriter) Flush() {}

func (w *stuckWriter) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deadline = t
	return nil
}

func (w *stuckWriter) SetReadDeadline(time.Time) error { return nil }

func (w *stuckWriter) started() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes > 0
}

// TestEventStreamStuckClient: a client that stops reading holds up no
// publish (creates go on), and is cut off once a write misses the stream's
// write timeout, which frees its slot.
func TestEventStreamStuckClient(t *testing.T) {
	e := newEnv(t, func(o *options) {
		o.Streams = sandboxapi.StreamLimits{PerToken: 1, WriteTimeout: 200 * time.Millisecond}
	})
	w := &stuckWriter{h: http.Header{}}
	req := httptest.NewRequest("GET", "/v1/events", nil)
	done := make(chan struct{})
	go func() { e.srv.LocalHandler().ServeHTTP(w, req); close(done) }()
	for deadline := time.Now().Add(5 * time.Second); !w.started(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream did not start")
		}
	}
	for range 3 {
		sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
		if err := e.c.Delete(e.ctx(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stuck stream was not cut off 5s after its write timeout of 200ms")
	}
	if resp := e.raw("GET", "/v1/events", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("the socket's one stream after the stuck one was cut off: %d", resp.StatusCode)
	}
}
