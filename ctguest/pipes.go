package ctguest

import (
	"errors"
	"io"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// readChunk is the most a pipe reader takes per read.
const readChunk = 64 << 10

// chunk is what a pipe reader hands the calling goroutine: bytes of its
// stream, or its end.
type chunk struct {
	stream int // 0 stdout, 1 stderr
	b      []byte
	eof    bool
}

// pipeReader reads one output pipe of a job in its own goroutine and
// hands the bytes over, one chunk at a time (the next read starts when the
// chunk was taken, so a slow consumer slows the container's writer, not
// the daemon's memory). Once every process of the job is gone, drain
// bounds the rest: the reader takes what the pipe holds at that moment
// and stops, though a process outside the job (a container process that
// was handed the pipe's write end over a unix socket) keeps it open.
type pipeReader struct {
	f        *os.File
	stream   int
	out      chan<- chunk
	grace    time.Duration
	draining atomic.Bool
}

func startReader(f *os.File, stream int, out chan<- chunk, grace time.Duration) *pipeReader {
	r := &pipeReader{f: f, stream: stream, out: out, grace: grace}
	go r.loop()
	return r
}

func (r *pipeReader) loop() {
	budget := int64(-1) // the bytes left once draining; -1 before
	for {
		if budget < 0 && r.draining.Load() {
			budget = pending(r.f)
		}
		if budget == 0 {
			break
		}
		n := int64(readChunk)
		if budget > 0 {
			n = min(n, budget)
			// The bytes are in the pipe, unless another holder of a read
			// end took them: then give up after grace.
			_ = r.f.SetReadDeadline(time.Now().Add(r.grace))
		}
		buf := make([]byte, n)
		k, err := r.f.Read(buf)
		if k > 0 {
			if budget > 0 {
				budget -= int64(k)
			}
			r.out <- chunk{stream: r.stream, b: buf[:k]}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && budget < 0 {
				continue // drain woke the read
			}
			break // io.EOF, closed, or a drain read that found nothing
		}
	}
	r.out <- chunk{stream: r.stream, eof: true}
}

// drain makes the reader take only what the pipe holds now and stop.
// The deadline wakes a read that waits on an empty pipe; the reader
// sets its own deadlines from then on (it sees draining only after this
// one was set).
func (r *pipeReader) drain() {
	_ = r.f.SetReadDeadline(time.Now())
	r.draining.Store(true)
}

// pending is the number of bytes in the pipe (FIONREAD, TIOCINQ in x/sys), 0 when it
// cannot be read.
func pending(f *os.File) int64 {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ)
	})
	return int64(max(n, 0))
}

// feed copies src to the job's stdin and closes it at src's end; it does
// not close w after an error of src (the job is killed before stdin is
// closed, so a write script never takes a cut stream for a whole one). A
// container that stops reading stdin (the write fails) is no error of
// src's.
func feed(w *os.File, src io.Reader, done chan<- error) {
	if src == nil {
		done <- w.Close()
		return
	}
	buf := make([]byte, readChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				_ = w.Close()
				done <- nil
				return
			}
		}
		if errors.Is(err, io.EOF) {
			done <- w.Close()
			return
		}
		if err != nil {
			done <- err
			return
		}
	}
}
