package qga

import (
	"errors"
	"io"
)

// File transfers overlap the agent's work with the caller's stream: a
// write reads its next chunk from the source while the agent writes the
// current one, and a read hands each chunk to the destination while it
// asks the agent for the next. When the source is an HTTP request body or
// the destination a response (the sandbox API), the network I/O is hidden
// behind the agent's calls instead of adding to them. At most two chunks
// are in memory per transfer, as before: the one in the agent call and
// the one in the caller's stream.

// readAhead reads chunks of src in its own goroutine, one request at a
// time, into two buffers it alternates. A chunk returned by next stays
// valid until the next call to next after it. stop waits for the
// goroutine (a read in progress ends first), so src is not used after it.
type readAhead struct {
	src  io.Reader
	bufs [2][]byte
	i    int
	req  chan int
	res  chan chunk
	done chan struct{}
	busy bool // a request was sent whose chunk was not taken
}

type chunk struct {
	b     []byte
	asked int   // the requested size
	err   error // io.EOF once src is exhausted (b may hold its last bytes)
}

func newReadAhead(src io.Reader) *readAhead {
	ra := &readAhead{src: src, req: make(chan int), res: make(chan chunk, 1), done: make(chan struct{})}
	go ra.loop()
	return ra
}

func (ra *readAhead) loop() {
	defer close(ra.done)
	for n := range ra.req {
		b := ra.bufs[ra.i]
		if cap(b) < n {
			b = make([]byte, n)
			ra.bufs[ra.i] = b
		}
		ra.i ^= 1
		k, err := io.ReadFull(ra.src, b[:n])
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		ra.res <- chunk{b[:k], n, err}
	}
}

// request starts reading a chunk of n bytes.
func (ra *readAhead) request(n int) {
	ra.busy = true
	ra.req <- n
}

// next waits for the requested chunk.
func (ra *readAhead) next() chunk {
	ra.busy = false
	return <-ra.res
}

func (ra *readAhead) stop() {
	close(ra.req)
	if ra.busy {
		<-ra.res
	}
	<-ra.done
}

// asyncWriter writes chunks to w in its own goroutine. write hands a chunk
// over and returns once the chunk before it is written (so the caller may
// fetch the next one meanwhile), or with the error that stopped w; the
// chunk must not change afterwards. close waits for the last chunk and
// returns what was written and w's first error.
type asyncWriter struct {
	w    io.Writer
	in   chan []byte
	done chan struct{}
	n    int64 // owned by the goroutine until done is closed
	err  error // likewise
}

func newAsyncWriter(w io.Writer) *asyncWriter {
	aw := &asyncWriter{w: w, in: make(chan []byte), done: make(chan struct{})}
	go func() {
		defer close(aw.done)
		for b := range aw.in {
			k, err := aw.w.Write(b)
			aw.n += int64(k)
			if err != nil {
				aw.err = err
				return
			}
		}
	}()
	return aw
}

func (aw *asyncWriter) write(b []byte) error {
	select {
	case aw.in <- b:
		return nil
	case <-aw.done:
		return aw.err
	}
}

func (aw *asyncWriter) close() (int64, error) {
	close(aw.in)
	<-aw.done
	return aw.n, aw.err
}
