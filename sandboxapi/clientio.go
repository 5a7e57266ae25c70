package sandboxapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// clientIO bounds a guest I/O call's reads of the request body and writes
// of the answer (a streamed exec, a collected exec's answer, a file
// download or upload) so that a client that stops reading or sending
// cannot hold the call, and with it the sandbox's delete and the reaper,
// for the route's whole deadline (24 h for an exec): each write of the
// answer and each read of the body gets a deadline of its own,
// Streams.WriteTimeout from when it starts (capped by the route's), and
// when the call's operation is cancelled (the sandbox is deleted, the
// client went) the read deadline and, once the answer has begun, the
// write deadline are set to now, which ends a Read or Write blocked on
// the connection at once; a cancelled context alone does not.
type clientIO struct {
	rc      *http.ResponseController
	timeout time.Duration
	// readEnd and writeEnd are the route's own deadlines (zero: none).
	readEnd, writeEnd time.Time
	aborted           atomic.Bool
	// writing is set by the first write of the answer: an abort before it
	// leaves the write deadline alone, so the call's problem (a conflict:
	// the sandbox was deleted) is still written, after the call ended.
	writing atomic.Bool
	stop    func() bool
}

// chunk is the most one deadline covers of a longer write.
const clientChunk = 1 << 20

// errAborted: the call's operation ended (its sandbox was deleted or the
// client went) while its answer was being written.
var errAborted = errors.New("the call was cancelled while its client was being answered")

// guardClient starts bounding w's connection for the call whose operation
// context is ctx; the route's deadline (ctx's) is not an abort: the
// per-write deadline bounds what is left then, and the problem of a call
// that ran out of time is still written. Call stop when the handler ends.
func (s *Server) guardClient(ctx context.Context, w http.ResponseWriter) *clientIO {
	c := &clientIO{rc: http.NewResponseController(w), timeout: s.o.Streams.WriteTimeout}
	if dl, ok := ctx.Deadline(); ok {
		c.readEnd, c.writeEnd = dl, dl.Add(30*time.Second) // as setDeadlines
	}
	c.stop = context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return
		}
		c.aborted.Store(true)
		now := time.Now()
		_ = c.rc.SetReadDeadline(now)
		if c.writing.Load() {
			_ = c.rc.SetWriteDeadline(now)
		}
	})
	return c
}

// capped is now+timeout, or end when that is sooner.
func (c *clientIO) capped(end time.Time) time.Time {
	t := time.Now().Add(c.timeout)
	if !end.IsZero() && end.Before(t) {
		return end
	}
	return t
}

// arm sets the write deadline for one write. writing and the deadline
// are set before the abort flag is read, so an abort either is seen here
// or sets its deadline after this one.
func (c *clientIO) arm() error {
	c.writing.Store(true)
	_ = c.rc.SetWriteDeadline(c.capped(c.writeEnd))
	if c.aborted.Load() {
		_ = c.rc.SetWriteDeadline(time.Now())
		return errAborted
	}
	return nil
}

// writer wraps the handler's response writer: every write (at most
// clientChunk bytes under one deadline) and flush is armed.
func (c *clientIO) writer(w http.ResponseWriter) *guardedWriter {
	return &guardedWriter{ResponseWriter: w, c: c}
}

// body wraps a raw request body: each read is armed.
func (c *clientIO) body(r io.Reader) io.Reader { return &guardedBody{r: r, c: c} }

// guardedWriter is an http.ResponseWriter whose writes are bounded by
// its clientIO.
type guardedWriter struct {
	http.ResponseWriter
	c *clientIO
}

func (g *guardedWriter) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		if err := g.c.arm(); err != nil {
			return done, err
		}
		end := min(done+clientChunk, len(p))
		n, err := g.ResponseWriter.Write(p[done:end])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// ReadFrom keeps the response's own ReadFrom (sendfile(2)), a chunk per
// deadline.
func (g *guardedWriter) ReadFrom(r io.Reader) (int64, error) {
	rf, ok := g.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{g}, r)
	}
	// A LimitedReader is taken apart so that the response still sees the
	// file under it (sendfile(2) looks through one LimitedReader only).
	src, left := r, int64(-1)
	if lr, ok := r.(*io.LimitedReader); ok {
		src, left = lr.R, max(lr.N, 0)
		defer func() { lr.N = left }()
	}
	var total int64
	for left != 0 {
		if err := g.c.arm(); err != nil {
			return total, err
		}
		want := int64(clientChunk)
		if left > 0 {
			want = min(want, left)
		}
		n, err := rf.ReadFrom(io.LimitReader(src, want))
		total += n
		if left > 0 {
			left -= n
		}
		if err != nil || n < want {
			return total, err
		}
	}
	return total, nil
}

// Flush sends what is buffered under a deadline of its own.
func (g *guardedWriter) Flush() {
	if g.c.arm() == nil {
		_ = g.c.rc.Flush()
	}
}

// Unwrap lets a ResponseController reach the connection.
func (g *guardedWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// guardedBody arms the read deadline before each read of the body and
// puts the route's back at its end (net/http's background read of the
// idle connection would otherwise cancel the call when a per-read
// deadline passes while the call still works).
type guardedBody struct {
	r io.Reader
	c *clientIO
}

func (g *guardedBody) Read(p []byte) (int, error) {
	_ = g.c.rc.SetReadDeadline(g.c.capped(g.c.readEnd))
	if g.c.aborted.Load() {
		_ = g.c.rc.SetReadDeadline(time.Now())
		return 0, errAborted
	}
	n, err := g.r.Read(p)
	if err != nil {
		_ = g.c.rc.SetReadDeadline(g.c.readEnd)
		if g.c.aborted.Load() {
			_ = g.c.rc.SetReadDeadline(time.Now())
		}
	}
	return n, err
}
