package qga

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Options tune a Client. The zero value of every field selects its default.
type Options struct {
	// StallTimeout bounds the wait for the next bytes of a reply (and for a
	// request to be accepted). Default 10 s.
	StallTimeout time.Duration
	// CallTimeout bounds one command from request to complete reply,
	// whatever the progress. Default 60 s.
	CallTimeout time.Duration
	// DrainTimeout bounds the wait for an abandoned reply before the
	// connection is closed (closing a unix socket with unread data makes a
	// unix-listen qemu-ga quit, so the client reads and discards what is
	// still coming). Default 2 s.
	DrainTimeout time.Duration
	// MaxReplyBytes bounds one reply line. Default: what the largest file
	// chunk needs (4/3 MaxChunk + 64 KiB).
	MaxReplyBytes int
	// MaxChunk is the largest raw chunk of one guest-file-read/-write call.
	// Default 8 MiB; at most 47 MiB (qemu-ga rejects JSON tokens over 64 MiB).
	// A chunk in flight is held about two and a half times (its base64
	// reply line and the decoded bytes) and the garbage collector lets
	// the heap grow to twice what is live: at 16 MiB a streamed exec grew
	// the serving process by 70 to 100 MiB (e2e TestBedExec200MiB), at
	// 8 MiB by 45 to 48 MiB, and no slower.
	MaxChunk int
	// ChunkTarget is the duration one file chunk call aims for; the chunk
	// size adapts to the agent's measured speed so that no call holds the
	// socket much longer. Default 250 ms.
	ChunkTarget time.Duration
	// OutputLimit is the default cap on each of stdout and stderr of an
	// exec. Default 10 MiB.
	OutputLimit int64
	// InlineStdin is the largest stdin sent inline in guest-exec's
	// input-data; larger stdin goes through a guest temp file. Default 64 KiB.
	InlineStdin int
	// AcceptReplyWithoutID accepts replies that do not echo the command's
	// id, for agents older than QEMU 3.0. It weakens the detection of
	// unsolicited replies (a reply with a wrong id is still refused).
	AcceptReplyWithoutID bool
	// GuestTempDir is the guest directory for the client's temporary files
	// (exec output, large stdin). It is created with mode 0700 when
	// missing; its parent must not be writable by the guest's other users
	// (they could pre-create it). Default "/run/pve-inspect-qga".
	GuestTempDir string
	// GuestProgramDir receives the programs RunProgram uploads; it must
	// not be mounted noexec. Default "/var/lib/pve-inspect-qga".
	GuestProgramDir string
	// ExecOwnSession runs every direct exec (one without stdin, env, cwd
	// or user) through setsid, as the leader of its own session and
	// process group: one more program exec per command. By default the
	// command is started by the agent itself, tagged through its
	// environment, and stays in qemu-ga's process group, so a command
	// that signals its own group (`kill 0`) also signals the agent and
	// the other commands running in that guest. See execdirect.go.
	ExecOwnSession bool
	// Budget bounds the bytes the reply buffers of all connections hold
	// together (budget.go); share one between Clients to make it
	// node-wide. Default: a budget of DefaultBudget for this Client.
	Budget *Budget
}

const (
	defaultStallTimeout = 10 * time.Second
	defaultCallTimeout  = 60 * time.Second
	defaultDrainTimeout = 2 * time.Second
	defaultMaxChunk     = 8 << 20
	maxChunkLimit       = 47 << 20
	minChunk            = 64 << 10
	defaultChunkTarget  = 250 * time.Millisecond
	// DefaultOutputLimit is the default per-stream exec output cap.
	DefaultOutputLimit = 10 << 20
	defaultInlineStdin = 64 << 10
	replyOverhead      = 64 << 10
)

func (o Options) withDefaults() Options {
	if o.StallTimeout <= 0 {
		o.StallTimeout = defaultStallTimeout
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = defaultCallTimeout
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = defaultDrainTimeout
	}
	if o.MaxChunk <= 0 {
		o.MaxChunk = defaultMaxChunk
	}
	o.MaxChunk = min(max(o.MaxChunk, minChunk), maxChunkLimit)
	if o.MaxReplyBytes <= 0 {
		o.MaxReplyBytes = o.MaxChunk/3*4 + replyOverhead
	}
	if o.ChunkTarget <= 0 {
		o.ChunkTarget = defaultChunkTarget
	}
	if o.OutputLimit <= 0 {
		o.OutputLimit = DefaultOutputLimit
	}
	if o.InlineStdin <= 0 {
		o.InlineStdin = defaultInlineStdin
	}
	if o.GuestTempDir == "" {
		o.GuestTempDir = "/run/pve-inspect-qga"
	}
	if o.GuestProgramDir == "" {
		o.GuestProgramDir = "/var/lib/pve-inspect-qga"
	}
	if o.Budget == nil {
		o.Budget = NewBudget(0, 0)
	}
	return o
}

// Client talks to any number of guest agents. Commands for one socket are
// serialized (one connection at a time, never held idle); different sockets
// are fully parallel. A Client is safe for concurrent use and holds no
// goroutines or connections between calls.
type Client struct {
	opts Options

	mu    sync.Mutex
	locks map[string]*vmLock

	buffered atomic.Int64 // bytes currently held in reply buffers
	peak     atomic.Int64 // high-water mark of buffered
}

// vmLock is a mutex for one socket path that a waiter can give up on.
type vmLock struct {
	ch   chan struct{}
	refs int
}

// New returns a Client with the given options.
func New(opts Options) *Client {
	return &Client{opts: opts.withDefaults(), locks: map[string]*vmLock{}}
}

// Options returns the effective options (defaults filled in).
func (c *Client) Options() Options { return c.opts }

// BufferedBytes is the number of bytes the client currently holds in reply
// buffers, summed over all connections.
func (c *Client) BufferedBytes() int64 { return c.buffered.Load() }

// PeakBufferedBytes is the high-water mark of BufferedBytes since New or
// the last ResetPeak.
func (c *Client) PeakBufferedBytes() int64 { return c.peak.Load() }

// ResetPeak sets PeakBufferedBytes to the current BufferedBytes.
func (c *Client) ResetPeak() { c.peak.Store(c.buffered.Load()) }

// grow takes n more bytes for a reply buffer of a call for owner (when
// owned) from the budget and counts them in BufferedBytes.
func (c *Client) grow(owner string, owned bool, n int64) error {
	if err := c.opts.Budget.take(owner, owned, n); err != nil {
		return err
	}
	c.addBuffered(n)
	return nil
}

// shrink gives n bytes of reply buffers back.
func (c *Client) shrink(owner string, owned bool, n int64) {
	_ = c.opts.Budget.take(owner, owned, -n) // giving back never fails
	c.addBuffered(-n)
}

func (c *Client) addBuffered(n int64) {
	v := c.buffered.Add(n)
	for {
		p := c.peak.Load()
		if v <= p || c.peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// Agent returns a handle for the guest agent listening on socketPath (for
// Proxmox: /var/run/qemu-server/<vmid>.qga). It is cheap; handles for the
// same path share the per-VM serialization.
func (c *Client) Agent(socketPath string) *Agent {
	return &Agent{c: c, socket: filepath.Clean(socketPath)}
}

// lock takes the per-socket mutex, giving up when ctx ends.
func (c *Client) lock(ctx context.Context, path string) (func(), error) {
	c.mu.Lock()
	l := c.locks[path]
	if l == nil {
		l = &vmLock{ch: make(chan struct{}, 1)}
		c.locks[path] = l
	}
	l.refs++
	c.mu.Unlock()
	release := func() {
		c.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(c.locks, path)
		}
		c.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, fmt.Errorf("qga %s: wait for the agent: %w", path, context.Cause(ctx))
	}
}

// Agent is one guest agent socket seen through a Client.
type Agent struct {
	c      *Client
	socket string
	// win marks a Windows guest's agent (Client.WindowsGuests): a session
	// whose connect or sync fails, before any command is sent, is tried
	// again a few times (windows.go).
	win bool
}

// Socket returns the agent's socket path.
func (a *Agent) Socket() string { return a.socket }

// session runs fn on a fresh, resynchronized connection while holding the
// per-VM lock, then closes the connection cleanly. This is the only way the
// package talks to an agent: one short connection per command sequence.
func (a *Agent) session(ctx context.Context, fn func(*conn) error) error {
	for attempt := 1; ; attempt++ {
		sent, err := a.sessionOnce(ctx, fn)
		if err == nil || sent || !a.win || attempt >= winSessionAttempts || ctx.Err() != nil {
			return err
		}
		if serr := sleepCtx(ctx, winSessionDelay<<(attempt-1)); serr != nil {
			return err
		}
	}
}

// sessionOnce is one try of session; sent reports whether fn was reached
// (a command may have gone out), so that only a failed connect or sync is
// tried again.
func (a *Agent) sessionOnce(ctx context.Context, fn func(*conn) error) (sent bool, err error) {
	unlock, err := a.c.lock(ctx, a.socket)
	if err != nil {
		return false, err
	}
	defer unlock()
	cn, err := a.c.dial(ctx, a.socket)
	if err != nil {
		return false, err
	}
	defer cn.close()
	if err := cn.sync(); err != nil {
		return false, err
	}
	return true, fn(cn)
}
