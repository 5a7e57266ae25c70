// Package client is the Go client of the pve-inspect sandbox API
// (sandboxapi), used by the tests, the pve-inspectd CLI verbs and the demo.
// Errors from the server are returned as *apitype.Problem; branch on
// their Type.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Client calls one sandbox API endpoint.
type Client struct {
	base  string
	hc    *http.Client
	token string
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends a bearer token (needed over TCP).
func WithToken(tok string) Option { return func(c *Client) { c.token = tok } }

// WithHTTPClient replaces the HTTP client (tests: httptest's).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// New returns a client for an http(s):// base URL.
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewUnix returns a client that talks over the unix socket at path.
func NewUnix(path string, opts ...Option) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return New("http://pve-inspectd", append([]Option{WithHTTPClient(&http.Client{Transport: tr})}, opts...)...)
}

// NewTLS returns a client for https://addr; rootCAs nil uses the system
// pool (pass the node CA, /etc/pve/pve-root-ca.pem, for a node certificate).
func NewTLS(addr string, cfg *tls.Config, opts ...Option) *Client {
	tr := &http.Transport{TLSClientConfig: cfg}
	return New("https://"+addr, append([]Option{WithHTTPClient(&http.Client{Transport: tr})}, opts...)...)
}

func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// decodeProblem turns an error response into a *apitype.Problem.
func decodeProblem(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" {
		var p apitype.Problem
		if err := json.Unmarshal(b, &p); err == nil && p.Type != "" {
			return &p
		}
	}
	return &apitype.Problem{Type: "http-" + strconv.Itoa(resp.StatusCode), Status: resp.StatusCode, Title: resp.Status, Detail: strings.TrimSpace(string(b))}
}

// do sends a JSON request (in may be nil) and decodes a JSON answer into
// out (may be nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeProblem(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// IsProblem reports whether err is a problem document of type typ.
func IsProblem(err error, typ string) bool {
	var p *apitype.Problem
	return errors.As(err, &p) && p.Type == typ
}

// Health calls GET /v1/healthz.
func (c *Client) Health(ctx context.Context) (apitype.Health, error) {
	var h apitype.Health
	return h, c.do(ctx, "GET", "/v1/healthz", nil, &h)
}

// Capacity calls GET /v1/capacity: the node's free room against its caps.
func (c *Client) Capacity(ctx context.Context) (apitype.Capacity, error) {
	var cp apitype.Capacity
	return cp, c.do(ctx, "GET", "/v1/capacity", nil, &cp)
}

// OpenAPI fetches the OpenAPI document.
func (c *Client) OpenAPI(ctx context.Context) (map[string]any, error) {
	var d map[string]any
	return d, c.do(ctx, "GET", "/v1/openapi.json", nil, &d)
}

// Create creates a sandbox and returns it once every VM answers.
func (c *Client) Create(ctx context.Context, r apitype.CreateRequest) (apitype.Sandbox, error) {
	var sb apitype.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes", r, &sb)
}

// List lists sandboxes.
func (c *Client) List(ctx context.Context) ([]apitype.Sandbox, error) {
	var l apitype.SandboxList
	return l.Sandboxes, c.do(ctx, "GET", "/v1/sandboxes", nil, &l)
}

// Pool returns the warm pool's shapes and unclaimed members.
func (c *Client) Pool(ctx context.Context) (apitype.PoolStatus, error) {
	var st apitype.PoolStatus
	return st, c.do(ctx, "GET", "/v1/pool", nil, &st)
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (apitype.Sandbox, error) {
	var sb apitype.Sandbox
	return sb, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id), nil, &sb)
}

// Validate asks what a create of r would be refused for on this node,
// without creating anything.
func (c *Client) Validate(ctx context.Context, r apitype.CreateRequest) (apitype.ValidateReport, error) {
	var rep apitype.ValidateReport
	return rep, c.do(ctx, "POST", "/v1/sandboxes/validate", r, &rep)
}

// Extend sets the sandbox's expiry to now plus ttl.
func (c *Client) Extend(ctx context.Context, id string, ttl time.Duration) (apitype.Sandbox, error) {
	var sb apitype.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/extend", apitype.ExtendRequest{TTLSeconds: int64(ttl / time.Second)}, &sb)
}

// Egress returns a sandbox's egress policy and its recent denials.
func (c *Client) Egress(ctx context.Context, id string) (apitype.EgressStatus, error) {
	var st apitype.EgressStatus
	return st, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/egress", nil, &st)
}

// EgressLog returns a page of a sandbox's egress record (the DNS
// questions and connections of its guests); q's zero fields are left out.
func (c *Client) EgressLog(ctx context.Context, id string, q apitype.EgressLogQuery) (apitype.EgressLog, error) {
	v := url.Values{}
	if q.Type != "" {
		v.Set("type", q.Type)
	}
	if q.VM != "" {
		v.Set("vm", q.VM)
	}
	if q.Since > 0 {
		v.Set("since", strconv.FormatUint(q.Since, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/v1/sandboxes/" + url.PathEscape(id) + "/egress/log"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var l apitype.EgressLog
	return l, c.do(ctx, "GET", path, nil, &l)
}

// SetEgress replaces a sandbox's egress policy; it is enforced when the
// call returns.
func (c *Client) SetEgress(ctx context.Context, id string, p apitype.EgressPolicy) (apitype.EgressStatus, error) {
	var st apitype.EgressStatus
	return st, c.do(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(id)+"/egress", p, &st)
}

// Delete deletes a sandbox (no error when it is already gone).
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id), nil, nil)
}

// ErrNoEgressHandover: a delete with egress_log=true was answered 204 (a
// daemon that does not hand the egress record over): the sandbox is
// deleted, its record is not in the answer.
var ErrNoEgressHandover = errors.New("the daemon deleted the sandbox but answered no egress record (it predates egress_log)")

// DeleteKeepingEgress deletes a sandbox and returns its whole egress
// record as it stood once its VMs were gone (DELETE
// /v1/sandboxes/{id}?egress_log=true). A sandbox already gone is a
// not-found problem (its record went with its delete); a refusal
// (conflict: the sandbox is being created; unavailable: the node keeps
// no record; invalid-request) deleted nothing.
func (c *Client) DeleteKeepingEgress(ctx context.Context, id string) (apitype.EgressLog, error) {
	var l apitype.EgressLog
	err := c.deleteKeepingEgress(ctx, id, "application/json", func(_ http.Header, r io.Reader) error {
		if err := json.NewDecoder(r).Decode(&l); err != nil {
			return fmt.Errorf("delete %s: decode egress record: %w", id, err)
		}
		return nil
	})
	return l, err
}

// DeleteKeepingEgressStream is DeleteKeepingEgress with the records
// streamed (application/x-ndjson): fn gets each as it arrives, oldest
// first, and the answer holds the rest (sandbox, dropped, next) without
// records. An error of fn ends the read and is returned; the sandbox is
// deleted by then.
func (c *Client) DeleteKeepingEgressStream(ctx context.Context, id string, fn func(apitype.EgressRecord) error) (apitype.EgressLog, error) {
	l := apitype.EgressLog{Sandbox: id}
	err := c.deleteKeepingEgress(ctx, id, "application/x-ndjson", func(h http.Header, r io.Reader) error {
		l.Dropped, _ = strconv.ParseUint(h.Get("X-Egress-Dropped"), 10, 64)
		l.Next, _ = strconv.ParseUint(h.Get("X-Egress-Next"), 10, 64)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var rec apitype.EgressRecord
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				return fmt.Errorf("delete %s: bad egress record line: %w", id, err)
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("delete %s: read egress record: %w", id, err)
		}
		return nil
	})
	return l, err
}

// deleteKeepingEgress sends the delete with egress_log=true asking for
// accept, and hands a 200 answer's headers and body to read.
func (c *Client) deleteKeepingEgress(ctx context.Context, id, accept string, read func(http.Header, io.Reader) error) error {
	req, err := c.newRequest(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id)+"?egress_log=true", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", accept)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 300:
		return decodeProblem(resp)
	case resp.StatusCode == http.StatusNoContent:
		return ErrNoEgressHandover
	}
	return read(resp.Header, resp.Body)
}

func vmPath(id, vm string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/vms/" + url.PathEscape(vm)
}

// Exec runs a command and collects its output.
func (c *Client) Exec(ctx context.Context, id, vm string, r apitype.ExecRequest) (*apitype.ExecResult, error) {
	var res apitype.ExecResult
	if err := c.do(ctx, "POST", vmPath(id, vm)+"/exec", r, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command and copies its output to stdout and stderr as
// it arrives; the result carries the exit code.
func (c *Client) ExecStream(ctx context.Context, id, vm string, r apitype.ExecRequest, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, "POST", vmPath(id, vm)+"/exec", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, decodeProblem(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 256<<10), 1<<20)
	for sc.Scan() {
		var ev apitype.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("exec: bad stream record: %w", err)
		}
		switch ev.Type {
		case "stdout":
			if _, err := stdout.Write(ev.Data); err != nil {
				return nil, err
			}
		case "stderr":
			if _, err := stderr.Write(ev.Data); err != nil {
				return nil, err
			}
		case "exit":
			if ev.Result == nil {
				return nil, errors.New("exec: exit record without result")
			}
			return ev.Result, nil
		case "error":
			if ev.Problem == nil {
				return nil, errors.New("exec: error record without problem")
			}
			return nil, ev.Problem
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("exec: read stream: %w", err)
	}
	if err := ctx.Err(); err != nil {
		// The daemon ends the stream of a cancelled call cleanly; the
		// caller's cancellation is why, not a broken stream.
		return nil, fmt.Errorf("exec: %w", err)
	}
	return nil, errors.New("exec: stream ended without an exit record")
}

// WriteFile writes r (size bytes, -1 when unknown) to path in the VM.
func (c *Client) WriteFile(ctx context.Context, id, vm, path string, r io.Reader, size int64, mode uint32) error {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	req, err := c.newRequest(ctx, "PUT", vmPath(id, vm)+"/files?"+q.Encode(), r)
	if err != nil {
		return err
	}
	if size >= 0 {
		req.ContentLength = size
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeProblem(resp)
	}
	return nil
}

// ReadFile copies the VM's file at path to w and returns its size.
func (c *Client) ReadFile(ctx context.Context, id, vm, path string, w io.Writer) (int64, error) {
	req, err := c.newRequest(ctx, "GET", vmPath(id, vm)+"/files?"+url.Values{"path": {path}}.Encode(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("read file: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return 0, decodeProblem(resp)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("read file: %w", err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("read file: got %d of %d bytes", n, resp.ContentLength)
	}
	return n, nil
}

// Snapshot snapshots a VM.
func (c *Client) Snapshot(ctx context.Context, id, vm, name string) error {
	return c.do(ctx, "POST", vmPath(id, vm)+"/snapshots", apitype.SnapshotRequest{Name: name}, nil)
}

// Rollback rolls a VM back to a snapshot; it returns once the agent answers.
func (c *Client) Rollback(ctx context.Context, id, vm, name string) error {
	return c.do(ctx, "POST", vmPath(id, vm)+"/snapshots/"+url.PathEscape(name)+"/rollback", nil, nil)
}

// Check runs the containment check from vm ("" = the first VM).
func (c *Client) Check(ctx context.Context, id, vm string) (apitype.CheckReport, error) {
	var rep apitype.CheckReport
	return rep, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/check", apitype.CheckRequest{VM: vm}, &rep)
}
