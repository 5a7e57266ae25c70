package qga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

const (
	// maxSyncDiscard is the least bound of what may precede the sync
	// delimiter: qemu-ga answers the leading 0xFF with one short
	// parse-error line; but a request an earlier client left unfinished
	// (a cancelled file write, cut mid-chunk) stays in qemu-ga's parser
	// across clients, and the parse error that 0xFF then provokes echoes
	// it whole ("JSON parse error, stray '...'": 2 MiB of a cut 2 MiB
	// write, qemu-ga 7.2), so the bound is the larger of this and what
	// the largest request of ours may be (MaxReplyBytes: a chunk's base64
	// and 64 KiB). syncDiscard.
	maxSyncDiscard = 64 << 10
	// maxSyncAttempts bounds the delimited lines read while looking for
	// our sync id.
	maxSyncAttempts = 8
	// maxID: ids stay below 100000 so that Proxmox's own client, should it
	// ever see a stray reply of ours, treats it as stale.
	maxID = 100000
	// writeSlice is the size of one write with its own stall deadline.
	writeSlice = 256 << 10
	// drainLimit bounds the bytes discarded while draining an abandoned reply.
	drainLimit = 256 << 20
	readSize   = 64 << 10
)

// conn is one short connection to an agent. It is used by one goroutine;
// only the cancellation hook runs concurrently.
type conn struct {
	c      *Client
	socket string
	nc     *net.UnixConn
	ctx    context.Context
	stop   func() bool

	mu        sync.Mutex // guards cancelled and closing against deadline updates
	cancelled bool
	closing   bool

	buf     []byte // reply buffer, accounted in c.buffered by its capacity
	r, w    int    // unread window buf[r:w]
	pending bool   // a request was written whose reply was not consumed
	broken  error  // first protocol failure; the connection is unusable after it
	id      uint32
	// owner is whom the budget charges the buffers for (owned: the
	// context was marked, sandbox.WithOwner).
	owner string
	owned bool
	// limit, when set below the client's MaxReplyBytes, bounds the reply
	// lines of this connection's calls (a call that knows its replies are
	// small: guest-get-fsinfo).
	limit int
}

// grow takes n more bytes of the budget for this connection's buffers.
func (cn *conn) grow(n int64) error { return cn.c.grow(cn.owner, cn.owned, n) }

// shrink gives n bytes back.
func (cn *conn) shrink(n int64) { cn.c.shrink(cn.owner, cn.owned, n) }

// replyLimit is the bound on one reply line.
func (cn *conn) replyLimit() int {
	if cn.limit > 0 && cn.limit < cn.c.opts.MaxReplyBytes {
		return cn.limit
	}
	return cn.c.opts.MaxReplyBytes
}

// dial connects to the agent socket. A full listen backlog (EAGAIN: the
// agent serves one client at a time, e.g. Proxmox's own) is retried until
// the stall timeout.
func (c *Client) dial(ctx context.Context, path string) (*conn, error) {
	deadline := time.Now().Add(c.opts.StallTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	backoff := time.Millisecond
	for {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		var d net.Dialer
		nc, err := d.DialContext(dctx, "unix", path)
		cancel()
		if err == nil {
			cn := &conn{c: c, socket: path, nc: nc.(*net.UnixConn), ctx: ctx, id: uint32(1 + rand.IntN(maxID-1))}
			cn.owner, cn.owned = sandbox.OwnerOf(ctx)
			cn.stop = context.AfterFunc(ctx, func() {
				cn.mu.Lock()
				defer cn.mu.Unlock()
				if !cn.closing {
					cn.cancelled = true
					cn.nc.SetDeadline(time.Unix(1, 0))
				}
			})
			return cn, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("qga %s: connect: %w", path, ctx.Err())
		}
		if !errors.Is(err, syscall.EAGAIN) || time.Now().Add(backoff).After(deadline) {
			return nil, &ProtocolError{Kind: KindConnect, Socket: path, Err: err}
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, 50*time.Millisecond)
	}
}

// fail records and returns the error for a failed step. Failures caused by
// the caller's context come back as the context's error.
func (cn *conn) fail(kind Kind, cmd string, err error) error {
	if cn.ctx.Err() != nil {
		e := fmt.Errorf("qga %s %s: %w", cn.socket, cmd, cn.ctx.Err())
		if cn.broken == nil {
			cn.broken = e
		}
		return e
	}
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		pe = &ProtocolError{Kind: kind, Command: cmd, Err: err}
	}
	pe.Socket = cn.socket
	if cn.broken == nil {
		cn.broken = pe
	}
	return pe
}

// ioKind classifies a socket error.
func ioKind(err error) Kind {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return KindTimeout
	}
	return KindClosed
}

func (cn *conn) setDeadline(read bool, t time.Time) error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.cancelled {
		return cn.ctx.Err()
	}
	if read {
		return cn.nc.SetReadDeadline(t)
	}
	return cn.nc.SetWriteDeadline(t)
}

// stepDeadline is the deadline of the next read or write: the stall
// timeout, but never past the end of the call.
func (cn *conn) stepDeadline(callEnd time.Time) time.Time {
	t := time.Now().Add(cn.c.opts.StallTimeout)
	if callEnd.Before(t) {
		return callEnd
	}
	return t
}

func (cn *conn) callEnd() time.Time {
	t := time.Now().Add(cn.c.opts.CallTimeout)
	if d, ok := cn.ctx.Deadline(); ok && d.Before(t) {
		return d
	}
	return t
}

// write sends b in slices, each with its own stall deadline.
func (cn *conn) write(cmd string, b []byte, callEnd time.Time) error {
	for len(b) > 0 {
		n := min(len(b), writeSlice)
		if err := cn.setDeadline(false, cn.stepDeadline(callEnd)); err != nil {
			return cn.fail(KindClosed, cmd, err)
		}
		m, err := cn.nc.Write(b[:n])
		b = b[m:]
		if err != nil {
			return cn.fail(ioKind(err), cmd, fmt.Errorf("send: %w", err))
		}
	}
	return nil
}

// reserve makes room for a reply line of about n bytes in one allocation
// (within the reply bound), for a caller that knows the size of the reply
// it asked for: growing by doubling to a guest-file-read of 16 MiB (22 MiB
// of base64) allocates 64 MiB and holds 48 MiB at once while copying.
func (cn *conn) reserve(cmd string, n int) error {
	n = min(n, cn.replyLimit()+readSize)
	if len(cn.buf)-cn.r >= n {
		return nil
	}
	if err := cn.grow(int64(n - len(cn.buf))); err != nil {
		return cn.failBudget(cmd, err)
	}
	nb := make([]byte, n)
	cn.w = copy(nb, cn.buf[cn.r:cn.w])
	cn.r = 0
	cn.buf = nb
	return nil
}

// failBudget records a refused grow (ErrBudget): not the agent's fault, so
// not a ProtocolError, but the connection is unusable after it all the
// same (a reply may be half read).
func (cn *conn) failBudget(cmd string, err error) error {
	e := fmt.Errorf("qga %s %s: %w", cn.socket, cmd, err)
	if cn.broken == nil {
		cn.broken = e
	}
	return e
}

// fill reads more bytes into the buffer, growing it up to the reply bound.
func (cn *conn) fill(cmd string, callEnd time.Time) error {
	if cn.r == cn.w {
		cn.r, cn.w = 0, 0
	}
	if cn.w == len(cn.buf) {
		if cn.r > 0 {
			cn.w = copy(cn.buf, cn.buf[cn.r:cn.w])
			cn.r = 0
		} else {
			limit := cn.replyLimit() + readSize
			if len(cn.buf) >= limit {
				return cn.fail(KindTooLarge, cmd, fmt.Errorf("reply line longer than %d bytes", cn.replyLimit()))
			}
			n := min(max(2*len(cn.buf), readSize), limit)
			if err := cn.grow(int64(n - len(cn.buf))); err != nil {
				return cn.failBudget(cmd, err)
			}
			nb := make([]byte, n)
			copy(nb, cn.buf[:cn.w])
			cn.buf = nb
		}
	}
	if err := cn.setDeadline(true, cn.stepDeadline(callEnd)); err != nil {
		return cn.fail(KindClosed, cmd, err)
	}
	n, err := cn.nc.Read(cn.buf[cn.w:])
	cn.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("agent closed the connection")
	}
	return cn.fail(ioKind(err), cmd, fmt.Errorf("receive: %w", err))
}

// readLine returns the next reply line without its newline. The slice is
// valid until the next read.
func (cn *conn) readLine(cmd string, callEnd time.Time) ([]byte, error) {
	for {
		if i := bytes.IndexByte(cn.buf[cn.r:cn.w], '\n'); i >= 0 {
			line := cn.buf[cn.r : cn.r+i]
			cn.r += i + 1
			return line, nil
		}
		if cn.w-cn.r > cn.replyLimit() {
			return nil, cn.fail(KindTooLarge, cmd, fmt.Errorf("reply line longer than %d bytes", cn.replyLimit()))
		}
		if err := cn.fill(cmd, callEnd); err != nil {
			return nil, err
		}
	}
}

// syncDiscard bounds what a sync discards before its delimiter: at least
// maxSyncDiscard, and as much as the largest request this client sends,
// which a cancelled call may have left half-written in the agent's parser
// to be echoed back in its parse error.
func (cn *conn) syncDiscard() int {
	return max(maxSyncDiscard, cn.c.opts.MaxReplyBytes)
}

// sync resynchronizes the channel: 0xFF flushes whatever a previous client
// left in the agent's JSON parser, guest-sync-delimited with a fresh id is
// answered by 0xFF and the id; everything before that is discarded (within
// bounds).
func (cn *conn) sync() error {
	const cmd = "guest-sync-delimited"
	id := cn.nextID()
	req := fmt.Appendf([]byte{0xFF}, `{"execute":"guest-sync-delimited","arguments":{"id":%d}}`+"\n", id)
	end := cn.callEnd()
	if err := cn.write(cmd, req, end); err != nil {
		return err
	}
	cn.pending = true
	discarded, limit := 0, cn.syncDiscard()
	for range maxSyncAttempts {
		for {
			i := bytes.IndexByte(cn.buf[cn.r:cn.w], 0xFF)
			if i >= 0 {
				discarded += i
				cn.r += i + 1
			} else {
				discarded += cn.w - cn.r
				cn.r = cn.w
			}
			if discarded > limit { // also when the delimiter came in the same read
				return cn.fail(KindUnsolicited, cmd, fmt.Errorf("more than %d bytes before the sync delimiter", limit))
			}
			if i >= 0 {
				break
			}
			if err := cn.fill(cmd, end); err != nil {
				return err
			}
		}
		line, err := cn.readLine(cmd, end)
		if err != nil {
			return err
		}
		got, err := parseSyncReply(line)
		if err != nil {
			return cn.fail(KindMalformed, cmd, err)
		}
		if got == id {
			cn.pending = false
			return nil
		}
	}
	return cn.fail(KindWrongID, cmd, fmt.Errorf("sync id %d did not come back", id))
}

func (cn *conn) nextID() uint32 {
	cn.id = cn.id%(maxID-1) + 1
	return cn.id
}

// call sends one command with JSON arguments (nil for none) and decodes its
// return value into out (nil to ignore it).
func (cn *conn) call(cmd string, args any, out any) error {
	var raw []byte
	if args != nil {
		var err error
		if raw, err = json.Marshal(args); err != nil {
			return fmt.Errorf("qga %s: encode arguments: %w", cmd, err)
		}
	}
	return cn.callRaw(cmd, raw, out)
}

// callRaw is call with pre-encoded arguments (a JSON object).
func (cn *conn) callRaw(cmd string, args []byte, out any) error {
	id, end, err := cn.send(cmd, args)
	if err != nil {
		return err
	}
	line, err := cn.readLine(cmd, end)
	if err != nil {
		return err
	}
	return cn.finish(cmd, id, line, out)
}

// send writes one command and returns its id and the end of the call.
func (cn *conn) send(cmd string, args []byte) (uint32, time.Time, error) {
	if cn.broken != nil {
		return 0, time.Time{}, cn.broken
	}
	id := cn.nextID()
	req := make([]byte, 0, len(args)+96)
	req = append(req, `{"execute":`...)
	req = strconv.AppendQuote(req, cmd)
	if args != nil {
		req = append(req, `,"arguments":`...)
		req = append(req, args...)
	}
	req = append(req, `,"id":`...)
	req = strconv.AppendUint(req, uint64(id), 10)
	req = append(req, "}\n"...)
	end := cn.callEnd()
	cn.pending = true
	if err := cn.write(cmd, req, end); err != nil {
		return 0, time.Time{}, err
	}
	return id, end, nil
}

// finish checks the reply line to the command id and decodes it into out.
func (cn *conn) finish(cmd string, id uint32, line []byte, out any) error {
	err := parseReply(line, cmd, id, cn.c.opts.AcceptReplyWithoutID, out)
	var ae *AgentError
	if errors.As(err, &ae) {
		cn.pending = false
		return ae
	}
	if err != nil {
		return cn.fail(KindMalformed, cmd, err)
	}
	cn.pending = false
	return nil
}

// close ends the connection. If a reply may still be on its way (an
// abandoned or failed call, or unexpected extra bytes), it half-closes and
// discards what arrives for at most DrainTimeout before closing: closing a
// unix socket with unread data resets it, and a unix-listen qemu-ga quits
// on that.
func (cn *conn) close() {
	cn.stop()
	cn.mu.Lock()
	cn.closing = true
	cn.mu.Unlock()
	dirty := cn.pending || cn.r < cn.w
	if !dirty {
		// Cheap check for bytes we were not told about.
		cn.nc.SetReadDeadline(time.Now())
		var one [1]byte
		if n, _ := cn.nc.Read(one[:]); n > 0 {
			dirty = true
		}
	}
	if dirty {
		cn.nc.CloseWrite()
		cn.nc.SetReadDeadline(time.Now().Add(cn.c.opts.DrainTimeout))
		var scratch [32 << 10]byte
		for total := 0; total < drainLimit; {
			n, err := cn.nc.Read(scratch[:])
			total += n
			if err != nil {
				break
			}
		}
	}
	cn.nc.Close()
	cn.shrink(int64(len(cn.buf)))
	cn.buf = nil
}
