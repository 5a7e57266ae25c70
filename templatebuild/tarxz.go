package templatebuild

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/ulikunitz/xz"
)

// ErrArchive is wrapped by the refusals of an image archive's content
// (unpackMember): a member outside the archive's directory, a link or a
// device, no member of the name or two, one past its bound, a stream that
// is not the .tar.xz it says. A build that meets one uploads nothing, or
// frees what it uploaded.
var ErrArchive = errors.New("image archive refused")

// archiveLimits bound what unpacking an archive reads.
type archiveLimits struct {
	// Member bounds the member's size (a sparse member's logical size).
	Member int64
	// Unpacked bounds the whole tar stream the xz decompresses to.
	Unpacked int64
	// Bound, when set, names the setting of the bounds in their refusals.
	Bound string
}

// bound is the bounds' setting for a refusal ("" without one).
func (l archiveLimits) bound() string {
	if l.Bound == "" {
		return ""
	}
	return " (" + l.Bound + ")"
}

// unpackMember reads the .tar.xz stream r and hands the regular file
// named name in it ("name" or "./name") to take, its size from its
// header, its content as the archive has it (a sparse member's holes as
// zeros); take reads it all or fails. Every member is checked, the ones
// after name's too, and the stream is read to its end (the xz index and
// each block's check, which the decoder verifies), so that an archive
// nothing but its digest could refuse is the only kind that returns nil:
// a member whose name is absolute or holds "..", a link, a device or a
// fifo, a second member of the name, no member of it, one larger than
// lim.Member, a decompressed stream past lim.Unpacked, an xz block with a
// dictionary past maxXZDict, a stream of more than maxXZBlocks blocks,
// blocks whose dictionaries sum to more than lim.Unpacked and xzDictSlack,
// or any stream the decoders refuse
// (truncated, corrupt) each fail it. Nothing is written anywhere but to
// take.
func unpackMember(r io.Reader, name string, lim archiveLimits, take func(size int64, body io.Reader) error) error {
	zr, err := xz.NewReader(newXZGuard(r, maxXZDict, maxXZBlocks, lim.Unpacked+xzDictSlack))
	if err != nil {
		return fmt.Errorf("%w: not an xz stream: %v", ErrArchive, err)
	}
	un := &boundedReader{r: zr, left: lim.Unpacked,
		over: fmt.Errorf("%w: it unpacks to more than %d bytes%s", ErrArchive, lim.Unpacked, lim.bound())}
	tr := tar.NewReader(un)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return archiveErr("its tar", err)
		}
		ok, err := isMember(h, name)
		if err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		if found {
			return fmt.Errorf("%w: it holds %q twice", ErrArchive, name)
		}
		found = true
		if h.Size < 1 || h.Size > lim.Member {
			return fmt.Errorf("%w: %q is %d bytes: want 1 to %d%s", ErrArchive, name, h.Size, lim.Member, lim.bound())
		}
		body := &meteredReader{r: tr}
		if err := take(h.Size, body); err != nil {
			if body.err != nil {
				// the archive failed under the take (truncated, corrupt)
				return fmt.Errorf("%w: %w", archiveErr(quoted(name), body.err), err)
			}
			return err
		}
	}
	if !found {
		return fmt.Errorf("%w: it holds no %q", ErrArchive, name)
	}
	// the rest of the stream (the tar's end padding, the xz index and
	// footer) to its end, checked
	if _, err := io.Copy(io.Discard, un); err != nil {
		return archiveErr("its end", err)
	}
	return nil
}

// archiveErr is err reading the archive at where: an ErrArchive unless
// it is one already or comes from below the archive (the download).
func archiveErr(where string, err error) error {
	if errors.Is(err, ErrArchive) || errors.Is(err, errDownload) {
		return err
	}
	return fmt.Errorf("%w: %s: %v", ErrArchive, where, err)
}

// isMember reports whether h is the regular file name, and refuses a
// member no unpacking should meet (see unpackMember).
func isMember(h *tar.Header, name string) (bool, error) {
	n := h.Name
	if n == "" || strings.HasPrefix(n, "/") || slices.Contains(strings.Split(n, "/"), "..") {
		return false, fmt.Errorf("%w: a member %s outside the archive's directory", ErrArchive, quoted(n))
	}
	match := path.Clean(n) == name
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		return match, nil
	case tar.TypeDir, tar.TypeXGlobalHeader:
		if match {
			return false, fmt.Errorf("%w: %q is not a file", ErrArchive, name)
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: the member %s is of tar type %q (a link, device or fifo): only files and directories are taken", ErrArchive, quoted(n), string([]byte{h.Typeflag}))
}

// quoted is a member's name for an error: quoted, at most 100 bytes of
// it.
func quoted(n string) string {
	if len(n) > 100 {
		return fmt.Sprintf("%q...", n[:100])
	}
	return fmt.Sprintf("%q", n)
}

// meteredReader is r, counting the bytes read through it (n) and keeping
// its first failure other than io.EOF (err); its reader's alone.
type meteredReader struct {
	r   io.Reader
	n   int64
	err error
}

func (m *meteredReader) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	m.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && m.err == nil {
		m.err = err
	}
	return n, err
}

// boundedReader reads r up to left bytes; the read past them fails with
// over.
type boundedReader struct {
	r    io.Reader
	left int64
	over error
}

// Read implements io.Reader.
func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.over
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if int64(n) > b.left {
		b.left = -1
		return 0, b.over
	}
	b.left -= int64(n)
	return n, err
}
