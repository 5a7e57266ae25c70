package sandboxapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// rawRequest opens a TCP connection to the test server and writes head.
func rawRequest(t *testing.T, e *env, head string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.tcp.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	// A failure bound for the test, not a timing claim: the server must
	// act long before this.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	return conn
}

// TestSlowBodyCut: a client that sends its headers and then its body
// slowly is cut by the per-request read deadline; the call it was making
// does not happen.
func TestSlowBodyCut(t *testing.T) {
	e := newEnv(t, func(o *options) { o.RequestTimeout = 300 * time.Millisecond })
	sb := e.create(twoVMs())
	conn := rawRequest(t, e, fmt.Sprintf("POST /v1/sandboxes/%s/extend HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", sb.ID))
	// Trickle the rest one byte at a time while the connection lives.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode < 400 {
			t.Fatalf("slow body answered %s", resp.Status)
		}
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the server never cut the slow body")
	}
	got, gerr := e.c.Get(e.ctx(), sb.ID)
	if gerr != nil || !got.ExpiresAt.Equal(sb.ExpiresAt) {
		t.Errorf("sandbox after the cut request: %+v %v (expiry was %s)", got, gerr, sb.ExpiresAt)
	}
}

// TestUnauthorizedCloses: a request without a valid token is answered 401
// at once and its connection closed, the announced body never read.
func TestUnauthorizedCloses(t *testing.T) {
	e := newEnv(t, nil)
	for name, auth := range map[string]string{"no token": "", "bad token": "Authorization: Bearer nope\r\n"} {
		t.Run(name, func(t *testing.T) {
			conn := rawRequest(t, e, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n"+auth+
				"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer without the body: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
				t.Fatalf("got %s close=%v, want 401 with Connection: close", resp.Status, resp.Close)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("connection still open after the 401: %v", err)
			}
		})
	}
}

// TestCollectedOutputCap: an exec whose output is collected into one answer
// may ask for at most 64 MiB per stream, and (it reserves twice its limit)
// at most half its owner's share of the collected output (32 MiB at the
// defaults); a larger limit is refused before anything runs, naming
// output_limit, unless the output is streamed.
func TestCollectedOutputCap(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	sb := e.create(twoVMs())
	big := apitype.ExecRequest{Argv: []string{"echo", "hi"}, OutputLimit: 200 << 20}
	_, err := e.c.Exec(ctx, sb.ID, "a", big)
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || p.Field != "output_limit" || !strings.Contains(p.Detail, "x-ndjson") {
		t.Fatalf("collected exec asking 200 MiB: %v, want invalid output_limit pointing at streaming", err)
	}
	var out bytes.Buffer
	res, err := e.c.ExecStream(ctx, sb.ID, "a", big, &out, io.Discard)
	if err != nil || res.ExitCode != 0 || out.String() != "hi\n" {
		t.Fatalf("streamed exec asking 200 MiB: %+v %q %v", res, out.String(), err)
	}
	share := apitype.ExecRequest{Argv: []string{"echo", "hi"}, OutputLimit: 32<<20 + 1}
	if _, err := e.c.Exec(ctx, sb.ID, "a", share); !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || p.Field != "output_limit" || !strings.Contains(p.Detail, "owner_collected_bytes") {
		t.Fatalf("collected exec past half the owner's share: %v, want invalid output_limit naming the share", err)
	}
	ok := apitype.ExecRequest{Argv: []string{"echo", "hi"}, OutputLimit: 32 << 20}
	if _, err := e.c.Exec(ctx, sb.ID, "a", ok); err != nil {
		t.Fatalf("collected exec at the cap: %v", err)
	}
}

// blockingGuest holds every exec and file call of the API until
// released (the create's naming exec, sandbox names.go, passes).
type blockingGuest struct {
	sandbox.Guest
	started chan<- struct{}
	release <-chan struct{}
}

func (g blockingGuest) hold(ctx context.Context) error {
	g.started <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g blockingGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	if sandbox.IsNamingExec(r) {
		return g.Guest.Exec(ctx, r)
	}
	if err := g.hold(ctx); err != nil {
		return nil, err
	}
	return g.Guest.Exec(ctx, r)
}

func (g blockingGuest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	if err := g.hold(ctx); err != nil {
		return nil, err
	}
	return g.Guest.ExecStream(ctx, r, stdout, stderr)
}

func (g blockingGuest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	if err := g.hold(ctx); err != nil {
		return 0, err
	}
	return g.Guest.ReadFile(ctx, path, w, max)
}

// TestCallLimits: exec and file calls beyond the caps answer unavailable at
// once; the calls in flight finish, and a slot freed is usable again.
func TestCallLimits(t *testing.T) {
	started := make(chan struct{}, 8)
	release := make(chan struct{})
	e := newEnv(t, func(o *options) {
		o.MaxExecs, o.MaxFileCalls = 2, 1
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest {
			return blockingGuest{Guest: dial(p), started: started, release: release}
		}
	})
	ctx := e.ctx()
	sb := e.create(twoVMs())
	if err := e.c.WriteFile(ctx, sb.ID, "a", "/f", strings.NewReader("data"), 4, 0o644); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	for range 2 {
		go func() {
			_, err := e.c.Exec(ctx, sb.ID, "a", apitype.ExecRequest{Argv: []string{"echo", "x"}})
			errs <- err
		}()
	}
	go func() {
		_, err := e.c.ReadFile(ctx, sb.ID, "a", "/f", io.Discard)
		errs <- err
	}()
	for range 3 {
		<-started
	}
	if _, err := e.c.Exec(ctx, sb.ID, "b", apitype.ExecRequest{Argv: []string{"echo", "x"}}); !client.IsProblem(err, apitype.ProblemUnavailable) {
		t.Errorf("third exec: %v, want unavailable", err)
	}
	if _, err := e.c.ReadFile(ctx, sb.ID, "a", "/f", io.Discard); !client.IsProblem(err, apitype.ProblemUnavailable) {
		t.Errorf("second file read: %v, want unavailable", err)
	}
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("call in flight: %v", err)
		}
	}
	if _, err := e.c.Exec(ctx, sb.ID, "b", apitype.ExecRequest{Argv: []string{"echo", "x"}}); err != nil {
		t.Errorf("exec after the others finished: %v", err)
	}
}

// TestSpoolCap: file reads spool under the state dir and together may not
// pass SpoolBytes; a read that would is answered unavailable and leaves no
// spool file behind.
func TestSpoolCap(t *testing.T) {
	e := newEnv(t, func(o *options) { o.SpoolDir = ""; o.SpoolBytes = 1000 })
	ctx := e.ctx()
	sb := e.create(twoVMs())
	data := bytes.Repeat([]byte("x"), 2000)
	if err := e.c.WriteFile(ctx, sb.ID, "a", "/big", bytes.NewReader(data), int64(len(data)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteFile(ctx, sb.ID, "a", "/small", bytes.NewReader(data[:500]), 500, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.ReadFile(ctx, sb.ID, "a", "/big", io.Discard); !client.IsProblem(err, apitype.ProblemUnavailable) {
		t.Errorf("read over the spool cap: %v, want unavailable", err)
	}
	var got bytes.Buffer
	if _, err := e.c.ReadFile(ctx, sb.ID, "a", "/small", &got); err != nil || got.Len() != 500 {
		t.Errorf("read under the cap: %d bytes, %v", got.Len(), err)
	}
	left, err := os.ReadDir(filepath.Join(e.opts.StateDir, "spool"))
	if err != nil || len(left) != 0 {
		t.Errorf("spool dir under the state dir: %v %v", left, err)
	}
}

// TestCollectedBudget: collected execs in flight reserve twice their output
// limit from CollectedBytes; one that would pass it answers unavailable,
// while a streamed exec is not counted.
func TestCollectedBudget(t *testing.T) {
	started := make(chan struct{}, 4)
	release := make(chan struct{})
	e := newEnv(t, func(o *options) {
		o.CollectedBytes = 3 << 20
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest {
			return blockingGuest{Guest: dial(p), started: started, release: release}
		}
	})
	ctx := e.ctx()
	sb := e.create(twoVMs())
	req := apitype.ExecRequest{Argv: []string{"echo", "x"}, OutputLimit: 1 << 20}
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(ctx, sb.ID, "a", req)
		done <- err
	}()
	<-started
	if _, err := e.c.Exec(ctx, sb.ID, "b", req); !client.IsProblem(err, apitype.ProblemUnavailable) {
		t.Errorf("second collected exec over the budget: %v, want unavailable", err)
	}
	streamed := make(chan error, 1)
	go func() {
		_, err := e.c.ExecStream(ctx, sb.ID, "b", req, io.Discard, io.Discard)
		streamed <- err
	}()
	<-started
	close(release)
	if err := <-done; err != nil {
		t.Errorf("collected exec in flight: %v", err)
	}
	if err := <-streamed; err != nil {
		t.Errorf("streamed exec beside it: %v", err)
	}
	if _, err := e.c.Exec(ctx, sb.ID, "b", req); err != nil {
		t.Errorf("collected exec after the budget freed: %v", err)
	}
}

// TestSlowBodyHoldsNoDelete: a call whose client trickles its body does
// not hold a delete of the sandbox (which waits for the sandbox's
// operations) until the request's read deadline cuts the body: a snapshot
// reads its body before its operation begins, an exec's body read is cut
// when the delete cancels the operation (guardClient).
func TestSlowBodyHoldsNoDelete(t *testing.T) {
	for _, call := range []string{"snapshots", "exec"} {
		t.Run(call, func(t *testing.T) {
			e := newEnv(t, func(o *options) { o.RequestTimeout = 2 * time.Minute })
			sb := e.create(twoVMs())
			conn := rawRequest(t, e, fmt.Sprintf("POST /v1/sandboxes/%s/vms/a/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\n"+
				"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", sb.ID, call))
			// The server has the headers; let it reach the body read.
			time.Sleep(200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(e.ctx(), 20*time.Second)
			defer cancel()
			if err := e.c.Delete(ctx, sb.ID); err != nil {
				t.Fatalf("delete while a %s body trickles: %v (held by the call's operation?)", call, err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil && resp.StatusCode < 400 {
				t.Fatalf("the %s was answered %s before its body came", call, resp.Status)
			}
		})
	}
}
