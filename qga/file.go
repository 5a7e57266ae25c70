package qga

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// handleCloseTimeout bounds the fresh context used to close guest file
// handles after an error or a cancellation.
const handleCloseTimeout = 5 * time.Second

// Ping checks that the agent answers (guest-ping).
func (a *Agent) Ping(ctx context.Context) error {
	return a.session(ctx, func(cn *conn) error { return cn.call("guest-ping", nil, nil) })
}

// Info is the answer to guest-info.
type Info struct {
	Version  string        `json:"version"`
	Commands []CommandInfo `json:"supported_commands"`
}

// CommandInfo describes one command the agent knows.
type CommandInfo struct {
	Name            string `json:"name"`
	Enabled         bool   `json:"enabled"`
	SuccessResponse bool   `json:"success-response"`
}

// Info asks the agent for its version and commands (guest-info).
func (a *Agent) Info(ctx context.Context) (*Info, error) {
	var in Info
	err := a.session(ctx, func(cn *conn) error { return cn.call("guest-info", nil, &in) })
	if err != nil {
		return nil, err
	}
	return &in, nil
}

// fileOpen opens a guest file (guest-file-open) and returns its handle.
func (cn *conn) fileOpen(p, mode string) (int64, error) {
	var h int64
	err := cn.call("guest-file-open", struct {
		Path string `json:"path"`
		Mode string `json:"mode"`
	}{p, mode}, &h)
	return h, err
}

func (cn *conn) fileClose(h int64) error {
	return cn.call("guest-file-close", struct {
		Handle int64 `json:"handle"`
	}{h}, nil)
}

// fileRead reads up to count bytes (guest-file-read). A reply that claims
// more than was asked, or whose count disagrees with its data, is malformed.
// fileReadReplyOverhead bounds what a guest-file-read reply holds besides
// its data: {"return": {"count": N, "buf-b64": "...", "eof": false}} with
// an id, and the newline.
const fileReadReplyOverhead = 256

func (cn *conn) fileRead(h int64, count int) ([]byte, bool, error) {
	const cmd = "guest-file-read"
	var ret struct {
		Count int    `json:"count"`
		Data  []byte `json:"buf-b64"` // encoding/json decodes base64
		EOF   bool   `json:"eof"`
	}
	// the reply: the data in base64 and a few dozen bytes around it
	if err := cn.reserve(cmd, base64.StdEncoding.EncodedLen(count)+fileReadReplyOverhead); err != nil {
		return nil, false, err
	}
	err := cn.call(cmd, struct {
		Handle int64 `json:"handle"`
		Count  int   `json:"count"`
	}{h, count}, &ret)
	if err != nil {
		return nil, false, err
	}
	if len(ret.Data) > count || len(ret.Data) != ret.Count {
		return nil, false, cn.fail(KindMalformed, cmd, fmt.Errorf("count %d with %d bytes of data for a read of %d", ret.Count, len(ret.Data), count))
	}
	return ret.Data, ret.EOF, nil
}

// fileWrite writes data at the handle's position (guest-file-write).
func (cn *conn) fileWrite(h int64, data []byte) (int, error) {
	const cmd = "guest-file-write"
	args := make([]byte, 0, base64.StdEncoding.EncodedLen(len(data))+48)
	args = append(args, `{"handle":`...)
	args = strconv.AppendInt(args, h, 10)
	args = append(args, `,"buf-b64":"`...)
	args = base64.StdEncoding.AppendEncode(args, data)
	args = append(args, `"}`...)
	var ret struct {
		Count int  `json:"count"`
		EOF   bool `json:"eof"`
	}
	if err := cn.callRaw(cmd, args, &ret); err != nil {
		return 0, err
	}
	if ret.Count < 0 || ret.Count > len(data) {
		return 0, cn.fail(KindMalformed, cmd, fmt.Errorf("wrote %d of %d bytes", ret.Count, len(data)))
	}
	return ret.Count, nil
}

// closeHandles closes guest handles on a fresh, short context so that they
// are released also when the caller's context is gone.
func (a *Agent) closeHandles(ctx context.Context, hs ...int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleCloseTimeout)
	defer cancel()
	var open []int64
	for _, h := range hs {
		if h >= 0 {
			open = append(open, h)
		}
	}
	if len(open) == 0 {
		return nil
	}
	return a.session(ctx, func(cn *conn) error {
		var errs []error
		for _, h := range open {
			if err := cn.fileClose(h); err != nil {
				errs = append(errs, err)
				if cn.broken != nil {
					break
				}
			}
		}
		return errors.Join(errs...)
	})
}

// chunker sizes file chunks so that one call takes about target: it follows
// the agent's measured throughput, at most doubling or halving per step.
type chunker struct {
	size, lo, hi int
	target       time.Duration
}

func (a *Agent) newChunker(hi int) *chunker {
	hi = min(hi, a.c.opts.MaxChunk)
	return &chunker{size: min(1<<20, hi), lo: min(minChunk, hi), hi: hi, target: a.c.opts.ChunkTarget}
}

func (k *chunker) observe(n int, d time.Duration) { k.observeAsked(k.size, n, d) }

// observeAsked is observe for a chunk of asked bytes, which a read-ahead
// chose before the size last changed.
func (k *chunker) observeAsked(asked, n int, d time.Duration) {
	if n < asked {
		return // a short (last) chunk says little about the rate
	}
	d = max(d, time.Millisecond)
	ideal := int(float64(n) * float64(k.target) / float64(d))
	k.size = min(max(ideal, k.size/2, k.lo), k.size*2, k.hi)
}

// maxReadChunk is the largest read whose base64 reply fits MaxReplyBytes,
// and that qemu-ga accepts (count <= 48 MiB).
func (a *Agent) maxReadChunk() int {
	n := (a.c.opts.MaxReplyBytes - 4096) / 4 * 3
	return max(min(n, 48<<20), 1)
}

// checkGuestPath validates a guest path for the file commands: absolute,
// clean, valid UTF-8 (it travels as a JSON string), no NUL.
func checkGuestPath(p string) error {
	switch {
	case p == "" || p[0] != '/':
		return fmt.Errorf("%w: guest path %q is not absolute", ErrInvalid, p)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: guest path contains NUL", ErrInvalid)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: guest path %q is not valid UTF-8", ErrInvalid, p)
	case path.Clean(p) != p:
		return fmt.Errorf("%w: guest path %q is not clean (want %q)", ErrInvalid, p, path.Clean(p))
	}
	return nil
}

// ReadFile copies the guest file at path to w and returns the number of
// bytes copied. The file is read in chunks, one short connection each, so
// other users of the socket (Proxmox's pings) interleave. A missing file,
// a directory and a refused open are reported as errors matching
// ErrNotFound, ErrIsDir and ErrPermission. If the file holds more than
// limit bytes (limit > 0), ReadFile stops with an error matching
// ErrTooLarge after copying at most limit bytes. w is written outside the
// per-VM lock, so a slow w does not block the VM's other operations.
func (a *Agent) ReadFile(ctx context.Context, p string, w io.Writer, limit int64) (int64, error) {
	return a.readFile(ctx, p, w, limit, nil)
}

// ReadFileSized reads like ReadFile but first learns the file's size from
// the open handle (guest-file-seek to its end and back) and calls size with
// it before anything is written to w; an error from size ends the read
// (returned as is) with nothing written. The size is the file's length at
// open time: a file that grows while it is read yields more bytes.
func (a *Agent) ReadFileSized(ctx context.Context, p string, w io.Writer, limit int64, size func(int64) error) (int64, error) {
	if size == nil {
		return 0, fmt.Errorf("%w: nil size callback", ErrInvalid)
	}
	return a.readFile(ctx, p, w, limit, size)
}

// fileSize returns the length of the open file h and rewinds it.
func (cn *conn) fileSize(h int64) (int64, error) {
	var end int64
	for i, whence := range []string{"end", "set"} {
		var ret struct {
			Position *int64 `json:"position"`
		}
		err := cn.call("guest-file-seek", struct {
			Handle int64  `json:"handle"`
			Offset int64  `json:"offset"`
			Whence string `json:"whence"`
		}{h, 0, whence}, &ret)
		if err != nil {
			return 0, err
		}
		if ret.Position == nil || *ret.Position < 0 || (i == 1 && *ret.Position != 0) {
			return 0, cn.fail(KindMalformed, "guest-file-seek", errors.New("missing or impossible position"))
		}
		if i == 0 {
			end = *ret.Position
		}
	}
	return end, nil
}

// unseekable explains a failed size seek on the open handle h: a directory
// opens, but its seek fails with EINVAL ("Invalid argument") where a read
// says "Is a directory". One read of a byte tells them apart; the read's
// error wins when it has one (ErrIsDir), the seek's otherwise.
func (cn *conn) unseekable(h int64, seekErr error) error {
	var ae *AgentError
	if !errors.As(seekErr, &ae) {
		return seekErr
	}
	if _, _, err := cn.fileRead(h, 1); err != nil {
		var re *AgentError
		if errors.As(err, &re) {
			return err
		}
	}
	return seekErr
}

func (a *Agent) readFile(ctx context.Context, p string, w io.Writer, limit int64, sizeFn func(int64) error) (int64, error) {
	if err := checkGuestPath(p); err != nil {
		return 0, err
	}
	return a.readChecked(ctx, p, w, limit, sizeFn)
}

// readChecked is readFile of a path already checked (a Linux or a
// Windows one): guest-file-open, -seek, -read and -close only, which
// qemu-ga serves alike on both.
func (a *Agent) readChecked(ctx context.Context, p string, w io.Writer, limit int64, sizeFn func(int64) error) (int64, error) {
	wrap := func(err error) error { return &PathError{Op: "read", Path: p, Err: err} }
	h := int64(-1)
	defer func() {
		if h >= 0 {
			a.closeHandles(ctx, h)
		}
	}()
	// w is written by a goroutine while the next chunk is fetched; end
	// stops it and returns what reached w. An error of w wins: it ended
	// the stream first.
	aw := newAsyncWriter(w)
	end := func(err error) (int64, error) {
		n, werr := aw.close()
		if werr != nil {
			return n, wrap(werr)
		}
		return n, err
	}
	k := a.newChunker(a.maxReadChunk())
	var fetched, size int64
	for first := true; ; first = false {
		count := k.size
		if limit > 0 {
			count = int(min(int64(count), limit-fetched+1))
		}
		var data []byte
		var eof bool
		start := time.Now()
		err := a.session(ctx, func(cn *conn) error {
			if first {
				var err error
				if h, err = cn.fileOpen(p, "r"); err != nil {
					return err
				}
				if sizeFn != nil {
					if size, err = cn.fileSize(h); err != nil {
						return cn.unseekable(h, err)
					}
				}
			}
			var err error
			if data, eof, err = cn.fileRead(h, count); err != nil {
				return err
			}
			if len(data) == 0 && !eof {
				return cn.fail(KindMalformed, "guest-file-read", errors.New("empty read without EOF"))
			}
			if eof || (limit > 0 && fetched+int64(len(data)) > limit) {
				err = cn.fileClose(h)
				h = -1
			}
			return err
		})
		if err != nil {
			return end(wrap(err))
		}
		if first && sizeFn != nil {
			if err := sizeFn(size); err != nil {
				return end(err)
			}
		}
		k.observe(len(data), time.Since(start))
		if limit > 0 && fetched+int64(len(data)) > limit {
			if err := aw.write(data[:limit-fetched]); err != nil {
				return end(nil)
			}
			return end(wrap(fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)))
		}
		if err := aw.write(data); err != nil {
			return end(nil)
		}
		fetched += int64(len(data))
		if eof {
			return end(nil)
		}
	}
}

// WriteFile writes everything r yields to the guest file at path with the
// permission bits of mode, atomically: the bytes go to a temporary file in
// the same directory, which is renamed over path once complete. Missing
// parent directories are created. On any error (or cancellation) the
// temporary file is removed and path is untouched.
func (a *Agent) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) error {
	if err := checkGuestPath(p); err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: cannot write to /", ErrInvalid)
	}
	if mode&^fs.ModePerm != 0 {
		return fmt.Errorf("%w: mode %v has bits beyond the permissions", ErrInvalid, mode)
	}
	dir := path.Dir(p)
	tmp := path.Join(dir, ".pve-inspect-"+randomTag()+".tmp")
	err := a.writeVia(ctx, r, writeSteps{
		open: func(ctx context.Context) (h int64, err error) {
			err = a.session(ctx, func(cn *conn) error {
				h, err = cn.fileOpen(tmp, "w")
				return err
			})
			return h, err
		},
		mkdir: func(ctx context.Context) (*runResult, error) {
			return a.run(ctx, []string{"/bin/mkdir", "-p", "--", dir})
		},
		// chmod then rename(2) (mv within one directory). A directory at
		// the destination is refused instead of moving the file into it.
		commit: func(ctx context.Context) (*runResult, error) {
			return a.run(ctx, []string{"/bin/sh", "-c",
				`if [ -d "$2" ]; then echo "$2: Is a directory" >&2; exit 3; fi; chmod "$3" -- "$1" && exec mv -f -- "$1" "$2"`,
				"pve-inspect-write", tmp, p, fmt.Sprintf("%04o", mode.Perm())})
		},
		remove: func(ctx context.Context) { a.removeGuestFiles(ctx, tmp) },
	})
	if err != nil {
		return &PathError{Op: "write", Path: p, Err: err}
	}
	return nil
}

// writeSteps are the guest's side of an atomic write (writeVia): open
// the temporary file for writing, create the parent directory, rename the
// temporary file over the target (exit code 3: the target is a
// directory), remove the temporary file.
type writeSteps struct {
	open   func(ctx context.Context) (int64, error)
	mkdir  func(ctx context.Context) (*runResult, error)
	commit func(ctx context.Context) (*runResult, error)
	remove func(ctx context.Context)
}

// writeVia writes everything r yields through s: the temporary file
// (its parent created on the first not-found), then the rename. On any
// error the handle is closed and the temporary file removed.
func (a *Agent) writeVia(ctx context.Context, r io.Reader, s writeSteps) error {
	h := int64(-1)
	committed := false
	defer func() {
		if h >= 0 {
			a.closeHandles(ctx, h)
		}
		if !committed {
			s.remove(ctx)
		}
	}()
	nh, err := s.open(ctx)
	if errors.Is(err, ErrNotFound) {
		res, rerr := s.mkdir(ctx)
		if rerr != nil {
			return fmt.Errorf("create parent directory: %w", rerr)
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("create parent directory: %w", res.err())
		}
		nh, err = s.open(ctx)
	}
	if err != nil {
		return err
	}
	h = nh
	if _, err := a.writeHandle(ctx, h, nil, r); err != nil {
		return err
	}
	err = a.session(ctx, func(cn *conn) error {
		err := cn.fileClose(h)
		h = -1
		return err
	})
	if err != nil {
		return err
	}
	res, err := s.commit(ctx)
	if err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	switch {
	case res.ExitCode == 3:
		return ErrIsDir
	case res.ExitCode != 0:
		return fmt.Errorf("rename into place: %w", res.err())
	}
	committed = true
	return nil
}

// writeHandle writes first and then everything from r to the open guest
// handle h, one chunk per connection, and returns the number of bytes
// written. r is read outside the per-VM lock, a chunk ahead: the next
// chunk is read while the agent writes the current one (pipeline.go).
func (a *Agent) writeHandle(ctx context.Context, h int64, first []byte, r io.Reader) (int64, error) {
	k := a.newChunker(a.c.opts.MaxChunk)
	src := io.Reader(bytes.NewReader(first))
	if r != nil {
		src = io.MultiReader(src, r)
	}
	ra := newReadAhead(src)
	defer ra.stop()
	ra.request(k.size)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		c := ra.next()
		if c.err != nil && c.err != io.EOF {
			return total, fmt.Errorf("read source: %w", c.err)
		}
		if c.err == nil {
			ra.request(k.size)
		}
		if len(c.b) > 0 {
			start := time.Now()
			rest := c.b
			err := a.session(ctx, func(cn *conn) error {
				for len(rest) > 0 {
					n, err := cn.fileWrite(h, rest)
					if err != nil {
						return err
					}
					if n == 0 {
						return fmt.Errorf("guest wrote 0 of %d bytes", len(rest))
					}
					rest = rest[n:]
				}
				return nil
			})
			if err != nil {
				return total, err
			}
			total += int64(len(c.b))
			k.observeAsked(c.asked, len(c.b), time.Since(start))
		}
		if c.err == io.EOF {
			return total, nil
		}
	}
}

// removeGuestFiles deletes guest files on a fresh short context (cleanup
// after errors); failures are ignored: there is nothing better to do.
func (a *Agent) removeGuestFiles(ctx context.Context, paths ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleCloseTimeout)
	defer cancel()
	a.run(ctx, append([]string{"/bin/rm", "-f", "--"}, paths...))
}
