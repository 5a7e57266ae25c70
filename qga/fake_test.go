package qga

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeAgent is a guest agent the test controls: it speaks the framing of
// qemu-ga (0xFF is answered with a parse error line, guest-sync-delimited
// with 0xFF and the id) and hands every other command to the test's
// handler, which writes whatever bytes it likes to the connection.
type fakeAgent struct {
	Socket string
	ln     net.Listener

	mu      sync.Mutex
	handler func(c net.Conn, cmd string, id json.RawMessage, args json.RawMessage) bool // false = close the connection
	sync    func(c net.Conn, id json.RawMessage) bool                                   // nil = well-behaved

	active, maxActive atomic.Int32
	conns             atomic.Int32
	wg                sync.WaitGroup
}

type fakeReq struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

// okHandler answers every command with an empty return and its id.
func okHandler(c net.Conn, cmd string, id, _ json.RawMessage) bool {
	reply(c, `{"return": {}, "id": `+string(id)+"}\n")
	return true
}

func reply(c net.Conn, s string) { c.Write([]byte(s)) }

func newFakeAgent(t testing.TB) *fakeAgent {
	t.Helper()
	f := &fakeAgent{Socket: filepath.Join(t.TempDir(), "fake.qga"), handler: okHandler}
	ln, err := net.Listen("unix", f.Socket)
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() { defer f.wg.Done(); f.serve(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeAgent) setHandler(h func(c net.Conn, cmd string, id, args json.RawMessage) bool) {
	f.mu.Lock()
	f.handler = h
	f.mu.Unlock()
}

func (f *fakeAgent) setSync(h func(c net.Conn, id json.RawMessage) bool) {
	f.mu.Lock()
	f.sync = h
	f.mu.Unlock()
}

func (f *fakeAgent) serve(c net.Conn) {
	defer c.Close()
	f.conns.Add(1)
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(line, 0xFF); i >= 0 {
			reply(c, `{"error": {"class": "GenericError", "desc": "JSON parse error, stray '\uFFFD'"}}`+"\n")
			line = line[i+1:]
		}
		var req fakeReq
		if err := json.Unmarshal(line, &req); err != nil {
			reply(c, `{"error": {"class": "GenericError", "desc": "JSON parse error"}}`+"\n")
			continue
		}
		f.mu.Lock()
		h, s := f.handler, f.sync
		f.mu.Unlock()
		// Count commands in flight (received, reply not yet written): a
		// client that serializes per VM never has two.
		n := f.active.Add(1)
		for {
			m := f.maxActive.Load()
			if n <= m || f.maxActive.CompareAndSwap(m, n) {
				break
			}
		}
		cc := &countingConn{Conn: c, f: f}
		cc.inflight.Store(true)
		ok := f.dispatch(cc, &req, h, s)
		cc.done()
		if !ok {
			return
		}
	}
}

// countingConn ends the command's in-flight count before the first byte of
// the reply goes out (the client may act on the reply at once). A handler
// may write from a goroutine of its own (flood) while serve ends the
// command: inflight is atomic.
type countingConn struct {
	net.Conn
	f *fakeAgent
	// inflight is atomic: a handler may keep writing from a goroutine of
	// its own (flood) while the next command is served.
	inflight atomic.Bool
}

func (c *countingConn) done() {
	if c.inflight.CompareAndSwap(true, false) {
		c.f.active.Add(-1)
	}
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.done()
	return c.Conn.Write(b)
}

func (f *fakeAgent) dispatch(c net.Conn, req *fakeReq, h func(c net.Conn, cmd string, id, args json.RawMessage) bool, s func(c net.Conn, id json.RawMessage) bool) bool {
	{
		if req.Execute == "guest-sync-delimited" {
			var a struct {
				ID json.RawMessage `json:"id"`
			}
			json.Unmarshal(req.Arguments, &a)
			if s != nil {
				return s(c, a.ID)
			}
			reply(c, "\xff{\"return\": "+string(a.ID)+"}\n")
			return true
		}
		return h(c, req.Execute, req.ID, req.Arguments)
	}
}
