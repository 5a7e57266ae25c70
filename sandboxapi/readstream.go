package sandboxapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// sizedReader is a Guest that learns a file's size before its first byte
// (the guest agent client does, with a seek on the open handle), so a
// download is checked against the cap and then streamed without a spool.
type sizedReader interface {
	sandbox.Guest
	ReadFileSized(ctx context.Context, path string, w io.Writer, max int64, size func(int64) error) (int64, error)
}

// streamFile answers a download from a sizedReader: the size from the
// guest is checked against MaxFileBytes before anything is sent, then the
// bytes stream with that size as Content-Length. A file that shrinks while
// it is read ends the response short (the client sees a truncated body, net/http
// closes the connection); one that grows is cut at the announced size.
//
// A file of at least DiskThreshold bytes goes through DiskTransfer when
// one is set; its response starts with the first verified byte.
func (s *Server) streamFile(ctx context.Context, w http.ResponseWriter, vmid int, g sizedReader, path string) error {
	cw := &cutWriter{w: w}
	var disk *useDisk
	_, err := g.ReadFileSized(ctx, path, cw, s.o.MaxFileBytes, func(n int64) error {
		if n > s.o.MaxFileBytes {
			return problemf(apitype.ProblemOutputLimit, "%s is larger than the cap of %d bytes", path, s.o.MaxFileBytes)
		}
		if s.e.UseDisk(vmid, n) {
			disk = &useDisk{size: n}
			return disk
		}
		cw.left = n
		startDownload(w, n)
		return nil
	})
	if disk != nil && errors.Is(err, disk) {
		lw := &lazyHeader{w: w, size: disk.size}
		if _, err := s.e.Download(ctx, vmid, path, disk.size, lw); err != nil {
			return err
		}
		if !lw.started {
			startDownload(w, 0)
		}
		return nil
	}
	if errors.Is(err, errCut) {
		return nil // the announced size was sent; the file grew meanwhile
	}
	return err
}

func startDownload(w http.ResponseWriter, size int64) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
}

// useDisk ends an agent read whose size calls for the disk path.
type useDisk struct{ size int64 }

func (u *useDisk) Error() string { return "file goes through the disk path" }

// lazyHeader sends the response header with the first byte, so an error
// before it is still a problem document.
type lazyHeader struct {
	w       http.ResponseWriter
	size    int64
	started bool
}

func (l *lazyHeader) Write(p []byte) (int, error) {
	l.start()
	return l.w.Write(p)
}

// ReadFrom lets the response copy from r its own way: net/http sends a
// file with sendfile(2). The header goes out before the first read.
func (l *lazyHeader) ReadFrom(r io.Reader) (int64, error) {
	l.start()
	return io.Copy(l.w, r)
}

func (l *lazyHeader) start() {
	if !l.started {
		l.started = true
		startDownload(l.w, l.size)
	}
}

// errCut ends a read once the announced size was written.
var errCut = errors.New("announced size reached")

// cutWriter passes at most left bytes and then fails with errCut.
type cutWriter struct {
	w    io.Writer
	left int64
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		n, err := c.w.Write(p[:c.left])
		c.left -= int64(n)
		if err != nil {
			return n, err
		}
		return n, errCut
	}
	n, err := c.w.Write(p)
	c.left -= int64(n)
	return n, err
}
