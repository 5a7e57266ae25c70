package probe

import (
	"cmp"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
)

// http sends one HTTP(S) request and reports the status code. The TCP
// outcome decides the result when no response arrives.
func (p *Prober) http(ctx context.Context, t Target, addr string) Result {
	if t.Name != "" {
		ip, err := p.resolveA(ctx, t.Resolver, t.Name)
		if err != nil {
			return Result{Outcome: OutcomeNoReply, Detail: "resolve " + t.Name + ": " + err.Error()}
		}
		_, port, _ := net.SplitHostPort(t.Addr)
		addr = net.JoinHostPort(ip.String(), port)
	}
	urlHost := strings.Replace(addr, "%", "%25", 1)
	if h := cmp.Or(t.Host, t.Name); h != "" {
		_, port, _ := net.SplitHostPort(addr)
		urlHost = net.JoinHostPort(h, port)
	}
	var connected atomic.Bool
	var dialErr atomic.Pointer[error] // a plain atomic.Value panics on differently typed errors
	tr := &http.Transport{
		Proxy: nil, // never a proxy from the environment
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			c, err := p.dialer().DialContext(ctx, network, addr) // the URL's host is the name to present
			if err != nil {
				dialErr.Store(&err)
				return nil, err
			}
			connected.Store(true)
			return c, nil
		},
		TLSClientConfig:    &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the probe asks "does it answer", not "is it genuine"
		DisableKeepAlives:  true,
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	scheme := "http"
	if t.Kind == KindHTTPS {
		scheme = "https"
	}
	method := t.Method
	if method == "" {
		method = http.MethodGet
	}
	path := t.Path
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(ctx, method, scheme+"://"+urlHost+path, nil)
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: "build request: " + err.Error()}
	}
	for k, v := range t.Headers {
		req.Header.Set(k, v)
	}
	if method == http.MethodPut {
		req.ContentLength = 0
		req.Body = http.NoBody
	}
	resp, err := client.Do(req)
	if err != nil {
		if !connected.Load() {
			if de := dialErr.Load(); de != nil {
				return Result{Outcome: classify(ctx, *de), Detail: (*de).Error()}
			}
			return Result{Outcome: classify(ctx, err), Detail: err.Error()}
		}
		// The route exists; the HTTP or TLS exchange failed after the handshake.
		return Result{Outcome: OutcomeOpen, Detail: "connected, no HTTP response: " + trimURL(err.Error())}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxHTTPBody))
	resp.Body.Close()
	return Result{Outcome: OutcomeResponse, HTTPStatus: resp.StatusCode, Detail: resp.Header.Get("Server")}
}

// trimURL drops the `Get "http://..": ` prefix of client errors.
func trimURL(s string) string {
	if i := strings.Index(s, "\": "); i >= 0 {
		return s[i+3:]
	}
	return s
}
