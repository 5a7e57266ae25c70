package ctguest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// diagMax bounds the stderr a file script's error quotes.
const diagMax = 4 << 10

// cleanupTimeout bounds the removal of a temporary file after an aborted
// write (on a fresh context: the caller's may be gone).
const cleanupTimeout = 10 * time.Second

// ReadFile copies the container file at p to w, read by cat in the
// container, and returns the number of bytes copied. A missing file, a
// directory and a refused open wrap sandbox.ErrFileNotFound,
// ErrIsDirectory and ErrPermission. If the file holds more than max bytes
// (max > 0), ReadFile stops with an error wrapping sandbox.ErrTooLarge
// after copying exactly max bytes. A FIFO or a device that never ends
// holds the call until ctx ends (or max is passed).
func (g *Guest) ReadFile(ctx context.Context, p string, w io.Writer, max int64) (int64, error) {
	return g.readFile(ctx, p, w, max, nil)
}

// ReadFileSized reads like ReadFile but first calls size with the file's
// length when it was opened (stat of the open descriptor in the
// container), before anything is written to w; an error from size ends
// the read and is returned as is. A file that grows while it is read
// yields more bytes; a /proc file says 0.
func (g *Guest) ReadFileSized(ctx context.Context, p string, w io.Writer, max int64, size func(int64) error) (int64, error) {
	if size == nil {
		return 0, fmt.Errorf("%w: nil size callback", sandbox.ErrGuestInvalid)
	}
	return g.readFile(ctx, p, w, max, size)
}

func (g *Guest) readFile(ctx context.Context, p string, w io.Writer, max int64, size func(int64) error) (int64, error) {
	if err := checkPath(p); err != nil {
		return 0, err
	}
	if max < 0 {
		return 0, fmt.Errorf("%w: negative cap", sandbox.ErrGuestInvalid)
	}
	limit := max
	if limit == 0 {
		limit = math.MaxInt64
	}
	var diag bytes.Buffer
	j := &job{sc: readScript(p), sized: true,
		out: sink{w: w, limit: limit, strict: true}, errOut: sink{w: &diag, limit: diagMax}}
	var sizeErr error
	if size != nil {
		j.onSize = func(n int64) error {
			sizeErr = size(n)
			return sizeErr
		}
	}
	oc, err := g.c.run(ctx, g.vmid, j)
	wrap := func(err error) error { return fmt.Errorf("ctguest read: ct %d: %s: %w", g.vmid, p, err) }
	switch {
	case sizeErr != nil && errors.Is(err, sizeErr):
		return 0, sizeErr
	case errors.Is(err, errTooLarge):
		return j.out.n, wrap(fmt.Errorf("%w (%d bytes)", sandbox.ErrTooLarge, max))
	case err != nil:
		return j.out.n, wrap(err)
	case !oc.started:
		return 0, wrap(notStarted(oc))
	}
	if err := fileStatus(oc.exitCode, diag.Bytes()); err != nil {
		return j.out.n, wrap(err)
	}
	return j.out.n, nil
}

// fileStatus maps a file script's exit status to an error (nil for 0).
// The text quoted is the container's stderr.
func fileStatus(code int, diag []byte) error {
	switch code {
	case 0:
		return nil
	case exitNotFound:
		return sandbox.ErrFileNotFound
	case exitIsDir:
		return sandbox.ErrIsDirectory
	case exitRefused:
		return fmt.Errorf("%w: %s", sandbox.ErrPermission, clip(diag))
	}
	msg := fmt.Sprintf("exit status %d: %s", code, clip(diag))
	if bytes.Contains(diag, []byte("No space left on device")) || bytes.Contains(diag, []byte("Disk quota exceeded")) {
		return fmt.Errorf("%w: %s", sandbox.ErrGuestNoSpace, msg)
	}
	switch code {
	case exitMkdir:
		return fmt.Errorf("create the parent directory: %s", msg)
	case exitWrite:
		return fmt.Errorf("write the temporary file: %s", msg)
	case exitCommit:
		return fmt.Errorf("rename into place: %s", msg)
	}
	return errors.New(msg)
}

// WriteFile writes everything r yields to the container file at p with
// the permission bits of mode, atomically: cat in the container writes a
// temporary file in p's directory (created with its parents when
// missing), which is chmod'ed and renamed over p once r ended. A
// symbolic link at p is replaced, not followed; a directory at p wraps
// sandbox.ErrIsDirectory. On any error (r's, ctx's, the container's) the
// job is killed before its stdin closes, so a cut stream is never
// renamed into place, and the temporary file is removed.
func (g *Guest) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) error {
	if err := checkPath(p); err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: cannot write to /", sandbox.ErrGuestInvalid)
	}
	if mode&^fs.ModePerm != 0 {
		return fmt.Errorf("%w: mode %v has bits beyond the permissions", sandbox.ErrGuestInvalid, mode)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	tmp := path.Join(path.Dir(p), ".pve-inspect-"+hex.EncodeToString(b[:])+".tmp")
	if r == nil {
		r = bytes.NewReader(nil)
	}
	var diag bytes.Buffer
	j := &job{sc: writeScript(p, tmp, fmt.Sprintf("%04o", mode.Perm())), stdin: r, stdinMust: true,
		errOut: sink{w: &diag, limit: diagMax}}
	oc, err := g.c.run(ctx, g.vmid, j)
	wrap := func(err error) error { return fmt.Errorf("ctguest write: ct %d: %s: %w", g.vmid, p, err) }
	if err != nil {
		g.remove(ctx, tmp)
		return wrap(err)
	}
	if !oc.started {
		return wrap(notStarted(oc))
	}
	if err := fileStatus(oc.exitCode, diag.Bytes()); err != nil {
		if oc.exitCode != exitIsDir {
			g.remove(ctx, tmp)
		}
		return wrap(err)
	}
	return nil
}

// remove deletes container files on a fresh short context; failures are
// ignored (there is nothing better to do).
func (g *Guest) remove(ctx context.Context, paths ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = g.c.run(ctx, g.vmid, &job{sc: removeScript(paths...), errOut: sink{limit: diagMax}})
}
