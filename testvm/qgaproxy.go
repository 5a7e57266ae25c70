package testvm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// agentProxy sits in front of a guest's qemu-ga socket: the socket the
// daemon dials is the proxy's, and it forwards each connection's byte
// streams to qemu-ga's own socket. It emulates qemu-ga's frozen state
// without freezing anything (the bed's guests share the host's file
// systems; a real FIFREEZE would freeze the host): while frozen it
// answers the commands qemu-ga refuses then with qemu-ga's refusal, and
// guest-fsfreeze-status itself. guest-fsfreeze-freeze,
// guest-fsfreeze-freeze-list and guest-fsfreeze-thaw never reach qemu-ga.
type agentProxy struct {
	ln       net.Listener
	upstream string
	// reason is the installed qemu-ga's reason for a command disabled
	// while frozen (frozenReason).
	reason string
	frozen atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// frozenAllowed are the commands qemu-ga runs while frozen (QEMU
// qga/main.c ga_freeze_allowlist; qapi-schema.json feature fs-frozen).
var frozenAllowed = map[string]bool{"guest-ping": true, "guest-info": true, "guest-sync": true,
	"guest-sync-delimited": true, "guest-fsfreeze-status": true, "guest-fsfreeze-thaw": true}

// noReply are the commands qemu-ga answers without a reply on success
// (qapi-schema.json success-response false).
var noReply = map[string]bool{"guest-shutdown": true, "guest-suspend-disk": true, "guest-suspend-ram": true, "guest-suspend-hybrid": true}

func startAgentProxy(ln net.Listener, upstream, reason string) *agentProxy {
	p := &agentProxy{ln: ln, upstream: upstream, reason: reason, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	return p
}

// close stops accepting, closes every connection and waits for them.
func (p *agentProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *agentProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		if p.conns == nil {
			return false
		}
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *agentProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// dialAgent connects to qemu-ga for the client c. qemu-ga serves one
// client at a time with a listen backlog of one (QEMU qga/channel-posix.c
// ga_channel_open: unix_listen), so a connect while it is busy fails with
// EAGAIN. The proxy has accepted c already, as a longer backlog would have,
// so it waits for qemu-ga as that backlog would: it retries until qemu-ga
// takes it, the proxy closes or the client goes away (a read of c that
// ends). Closing c on the first EAGAIN would be a reset real QEMU never
// sends to a connected client.
func (p *agentProxy) dialAgent(c net.Conn) (net.Conn, error) {
	backoff := time.Millisecond
	for {
		up, err := net.Dial("unix", p.upstream)
		if err == nil || !errors.Is(err, syscall.EAGAIN) {
			return up, err
		}
		p.mu.Lock()
		closed := p.conns == nil
		p.mu.Unlock()
		if closed || clientGone(c) {
			return nil, err
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, 20*time.Millisecond)
	}
}

// clientGone says whether c's peer closed it: a unix socket with nothing
// to read polls readable only at EOF or error, so a zero-length peek with
// MSG_PEEK|MSG_DONTWAIT tells EOF (0, nil) from a live idle peer (EAGAIN).
// Bytes already sent by the client also mean it is there.
func clientGone(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = err == nil && n == 0 || err != nil && !errors.Is(err, syscall.EAGAIN)
	})
	return gone
}

// proxyConn is one client connection and its connection to qemu-ga.
type proxyConn struct {
	client, agent net.Conn
	mu            sync.Mutex // serializes writes to the client
	cond          *sync.Cond
	sent, replied int // commands forwarded that expect a reply; replies seen
	agentDone     bool
}

func (p *agentProxy) handle(c net.Conn) {
	defer c.Close()
	up, err := p.dialAgent(c)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(c, true) || !p.track(up, true) {
		return
	}
	defer p.track(c, false)
	defer p.track(up, false)
	pc := &proxyConn{client: c, agent: up}
	pc.cond = sync.NewCond(&pc.mu)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pc.fromAgent()
	}()
	pc.fromClient(p)
	// The client has stopped sending (it closed, half-closed, failed or
	// went away mid-request), but qemu-ga may still owe it replies, and a
	// unix socket closed with bytes unread in it resets its peer
	// (net/unix/af_unix.c unix_release_sock: ECONNRESET): a unix-listen
	// qemu-ga's next read fails and it quits (QEMU qga/main.c
	// channel_event_cb: "error reading channel", stop_agent), taking the
	// guest with it. So the proxy half-closes instead, as qemu-ga's own
	// clients do (qga conn.close): qemu-ga answers what it read, reads
	// EOF and closes its end, and fromAgent takes every reply up to that
	// EOF (the client gets them, or they are dropped once it is gone).
	if cw, ok := up.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = up.Close()
	}
	<-done
}

// fromAgent copies qemu-ga's replies to the client, counting the JSON
// objects, so a reply of the proxy's own is written after every reply
// qemu-ga owes for the commands before it. It reads until qemu-ga closes
// its end (or the proxy closes), also once the client is gone: a reply
// left unread would reset qemu-ga when the proxy closes (handle).
func (pc *proxyConn) fromAgent() {
	r := bufio.NewReader(pc.agent)
	var sc objScanner
	buf := make([]byte, 32<<10)
	var werr error // the first failed write to the client: the rest is dropped
	for {
		n, err := r.Read(buf)
		if n > 0 {
			objs := sc.feed(buf[:n], nil)
			pc.mu.Lock()
			if werr == nil {
				_, werr = pc.client.Write(buf[:n])
			}
			pc.replied += objs
			pc.cond.Broadcast()
			pc.mu.Unlock()
		}
		if err != nil {
			break
		}
	}
	pc.mu.Lock()
	pc.agentDone = true
	pc.cond.Broadcast()
	pc.mu.Unlock()
}

// fromClient forwards the client's bytes to qemu-ga, object by object,
// answering the ones the proxy handles itself.
func (pc *proxyConn) fromClient(p *agentProxy) {
	var sc objScanner
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			var werr error
			sc.feed(buf[:n], func(chunk []byte, obj bool) {
				if werr != nil {
					return
				}
				if !obj {
					// qemu-ga's parser answers each 0xFF with a parse
					// error (the client discards it)
					pc.mu.Lock()
					pc.sent += bytes.Count(chunk, []byte{0xff})
					pc.mu.Unlock()
					_, werr = pc.agent.Write(chunk)
					return
				}
				werr = pc.command(p, chunk)
			})
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// command forwards one JSON object or answers it.
func (pc *proxyConn) command(p *agentProxy, obj []byte) error {
	var req struct {
		Execute string          `json:"execute"`
		ID      json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal(obj, &req)
	reply, own := p.answer(req.Execute, req.ID)
	if !own {
		pc.mu.Lock()
		if req.Execute != "" && !noReply[req.Execute] {
			pc.sent++
		} else if req.Execute == "" {
			pc.sent++ // qemu-ga answers a malformed request with an error
		}
		pc.mu.Unlock()
		_, err := pc.agent.Write(obj)
		return err
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for pc.replied < pc.sent && !pc.agentDone {
		pc.cond.Wait()
	}
	if pc.agentDone {
		return errors.New("qemu-ga went away")
	}
	_, err := pc.client.Write(append(reply, '\n'))
	return err
}

// answer is the proxy's own reply to command, own false when qemu-ga is
// to answer it.
func (p *agentProxy) answer(command string, id json.RawMessage) (reply []byte, own bool) {
	// qapi/qmp-dispatch.c qmp_dispatch copies the request's id into the
	// reply
	msg := func(m map[string]any) []byte {
		if len(id) > 0 {
			m["id"] = id
		}
		b, _ := json.Marshal(m)
		return b
	}
	ret := func(v any) []byte { return msg(map[string]any{"return": v}) }
	frozen := p.frozen.Load()
	switch command {
	case "guest-fsfreeze-freeze", "guest-fsfreeze-freeze-list":
		// never a real freeze on the bed
		return msg(map[string]any{"error": map[string]any{"class": "GenericError",
			"desc": "the test bed does not freeze file systems (its guests share the host's)"}}), true
	case "guest-fsfreeze-thaw":
		// qga/commands-posix.c qmp_guest_fsfreeze_thaw: the number thawed
		if frozen {
			p.frozen.Store(false)
			return ret(1), true
		}
		return ret(0), true
	case "guest-fsfreeze-status":
		if frozen {
			return ret("frozen"), true
		}
		return ret("thawed"), true
	}
	if frozen && command != "" && !frozenAllowed[command] {
		// qapi/qmp-dispatch.c on a command disabled while frozen
		return msg(map[string]any{"error": map[string]any{"class": "CommandNotFound",
			"desc": "Command " + command + " has been disabled: " + p.reason}}), true
	}
	return nil, false
}

// objScanner splits a byte stream into top-level JSON objects and the
// bytes between them (whitespace, qemu-ga's 0xFF delimiters), across
// reads: strings and escapes are tracked so braces inside strings do not
// count.
type objScanner struct {
	depth    int
	inString bool
	escape   bool
	obj      []byte
}

// feed scans b; emit, when not nil, gets each complete object (obj
// true) and each run of bytes outside objects (obj false). It returns
// the number of objects completed. A scanner is fed with emit always nil
// or never: without emit it keeps no bytes.
func (s *objScanner) feed(b []byte, emit func(chunk []byte, obj bool)) int {
	n := 0
	start := 0
	for i, c := range b {
		if s.depth == 0 {
			if c != '{' {
				continue
			}
			if emit != nil && i > start {
				emit(b[start:i], false)
			}
			start = i
			s.depth = 1
			continue
		}
		if c == 0xff {
			// qemu-ga's parser resets on 0xFF: so does the scanner
			s.depth, s.inString, s.escape, s.obj = 0, false, false, nil
			start = i
			continue
		}
		switch {
		case s.escape:
			s.escape = false
		case s.inString:
			if c == '\\' {
				s.escape = true
			} else if c == '"' {
				s.inString = false
			}
		case c == '"':
			s.inString = true
		case c == '{':
			s.depth++
		case c == '}':
			s.depth--
			if s.depth == 0 {
				n++
				if emit != nil {
					emit(append(s.obj, b[start:i+1]...), true)
				}
				s.obj = nil
				start = i + 1
			}
		}
	}
	if s.depth > 0 {
		// the object's bytes are kept for emit only: counting needs none
		// (a guest-exec-status reply of qemu-ga carries up to 16 MiB of
		// output, base64)
		if emit != nil {
			s.obj = append(s.obj, b[start:]...)
		}
	} else if emit != nil && start < len(b) {
		emit(b[start:], false)
	}
	return n
}

// frozenReason is the reason qemu-ga of version (qemu-ga -V: "QEMU Guest
// Agent 7.2.22") gives a command it disabled while frozen: "the agent is
// in frozen state" up to 9.0 (qga/main.c ga_disable_not_allowed_freeze),
// "the command is not allowed" from 9.1 (ga_apply_command_filters_iter).
func frozenReason(version string) string {
	var major, minor int
	f := strings.Fields(version)
	if len(f) > 0 {
		parts := strings.SplitN(f[len(f)-1], ".", 3)
		if len(parts) >= 2 {
			major, _ = strconv.Atoi(parts[0])
			minor, _ = strconv.Atoi(parts[1])
		}
	}
	if major > 9 || (major == 9 && minor >= 1) {
		return "the command is not allowed"
	}
	return "the agent is in frozen state"
}
