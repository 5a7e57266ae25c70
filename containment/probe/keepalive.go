package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// KindKeepAlive is a two-phase target: an HTTP/1.1 keep-alive connection
// over TLS (certificate not verified, server name Host or Name, no ALPN)
// to the first address of Name (asked of Resolver) at Addr's port (Addr's
// address is 0.0.0.0), one request, then [ReadyPrefix] and the target's
// id on a line of stderr, a wait of at most [KeepAliveWaitMS] until the
// file Signal exists (the host changes the sandbox's policy meanwhile),
// and a second request on the same connection. The result is
// [OutcomeResponse] when the second request was answered (the old
// connection still works), [OutcomeOpen] when the connection failed or
// closed before an answer, and [OutcomeError] when the first request got
// no answer or no signal came (nothing is proven).
const KindKeepAlive Kind = "https-keepalive"

// ReadyPrefix starts the stderr line a keep-alive target writes once its
// first request was answered; the target's id follows.
const ReadyPrefix = "pve-inspect-probe: keep-alive ready "

// KeepAliveWaitMS is the longest a keep-alive target waits for its signal.
const KeepAliveWaitMS = 30_000

// keepAliveBound is the longest a keep-alive target of per-step timeout
// ms takes: both requests and the wait.
func keepAliveBound(ms int) time.Duration {
	return time.Duration(2*ms+KeepAliveWaitMS) * time.Millisecond
}

// keepAlive runs a KindKeepAlive target (addr is already the name's
// address); step bounds each request.
func (p *Prober) keepAlive(ctx context.Context, t Target, addr string, step time.Duration) Result {
	dctx, cancel := context.WithTimeout(ctx, step)
	c, err := p.dialer().DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: "first request: connect: " + err.Error()}
	}
	host := t.Host
	if host == "" {
		host = t.Name
	}
	c = tls.Client(c, &tls.Config{ServerName: host, InsecureSkipVerify: true}) //nolint:gosec // the probe asks "does it answer", not "is it genuine"
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := keepAliveGet(c, br, host, t.Path, step); err != nil {
		return Result{Outcome: OutcomeError, Detail: "first request: " + err.Error()}
	}
	p.ready(t.ID)
	if err := waitFile(ctx, t.Signal, KeepAliveWaitMS*time.Millisecond); err != nil {
		return Result{Outcome: OutcomeError, Detail: "no signal after the first request: " + err.Error()}
	}
	_ = os.Remove(t.Signal) // best effort: the host made it for this run
	status, err := keepAliveGet(c, br, host, t.Path, step)
	if err != nil && status == 0 {
		return Result{Outcome: OutcomeOpen, Detail: "second request on the old connection: " + err.Error()}
	}
	return Result{Outcome: OutcomeResponse, HTTPStatus: status, Detail: "the old connection answered a second request"}
}

// keepAliveGet sends one GET on c and reads its response (the body
// drained, so the connection is ready for the next). The status is that
// of a response that arrived (0: none), also when err says the
// connection cannot carry another request.
func keepAliveGet(c net.Conn, br *bufio.Reader, host, path string, step time.Duration) (int, error) {
	if path == "" {
		path = "/"
	}
	if err := c.SetDeadline(time.Now().Add(step)); err != nil {
		return 0, err
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: keep-alive\r\n\r\n", path, host); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxHTTPBody)); err != nil {
		return resp.StatusCode, err
	}
	if resp.Close {
		return resp.StatusCode, errors.New("the server closes the connection after one response")
	}
	return resp.StatusCode, nil
}

// ready tells the host, on the Ready writer, that target id is waiting
// for its signal.
func (p *Prober) ready(id string) {
	if p.Ready == nil {
		return
	}
	p.readyMu.Lock()
	defer p.readyMu.Unlock()
	fmt.Fprintln(p.Ready, ReadyPrefix+id)
}

// waitFile waits until path exists, at most d.
func waitFile(ctx context.Context, path string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", path, context.Cause(ctx))
		case <-tick.C:
		}
	}
}
