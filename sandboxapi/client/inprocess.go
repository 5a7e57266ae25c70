package client

import (
	"io"
	"net/http"
	"sync"
)

// NewInProcess returns a client that calls h directly, without a socket:
// the faces that run inside the daemon (the MCP server at /v1/mcp) reach the
// API this way, with the caller's token (WithToken), so the API applies the
// same scopes as to any TCP caller. Responses stream: a body is readable
// while the handler still writes it.
func NewInProcess(h http.Handler, opts ...Option) *Client {
	return New("http://pve-inspectd", append([]Option{WithHTTPClient(&http.Client{Transport: handlerTransport{h: h}})}, opts...)...)
}

// handlerTransport is an http.RoundTripper that serves each request with a
// handler in its own goroutine; the goroutine ends when the handler returns
// (the request's context ends it early when the caller gives up).
type handlerTransport struct{ h http.Handler }

// RoundTrip implements http.RoundTripper.
func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	w := &pipeWriter{hdr: http.Header{}, pw: pw, ready: make(chan struct{})}
	srvReq := req.Clone(req.Context())
	srvReq.RequestURI = req.URL.RequestURI()
	srvReq.RemoteAddr = "in-process"
	if srvReq.Body == nil {
		srvReq.Body = http.NoBody
	}
	go func() {
		defer func() {
			w.WriteHeader(http.StatusOK) // no-op when already sent
			pw.Close()
		}()
		t.h.ServeHTTP(w, srvReq)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status:        http.StatusText(w.code),
		StatusCode:    w.code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          pr,
		ContentLength: -1,
		Request:       req,
	}, nil
}

// pipeWriter is the handler's side of an in-process response.
type pipeWriter struct {
	hdr   http.Header
	pw    *io.PipeWriter
	once  sync.Once
	ready chan struct{}
	code  int
	sent  http.Header // copy of hdr taken at WriteHeader
}

func (w *pipeWriter) Header() http.Header { return w.hdr }

func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.hdr.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

// Flush is a no-op: every Write reaches the reader at once.
func (w *pipeWriter) Flush() {}
