package sandboxapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi"
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
	e := newEnv(t, func(o *sandboxapi.Options) { o.RequestTimeout = 300 * time.Millisecond })
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
