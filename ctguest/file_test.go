package ctguest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// source yields n pseudo-random bytes in small reads (never all at once,
// as a request body arrives), then fails with err (io.EOF: a clean end);
// after the first half it calls mid, if set.
type source struct {
	r    *rand.ChaCha8
	n    int64
	err  error
	mid  func()
	done int64
}

func newSource(n int64, err error) *source {
	return &source{r: rand.NewChaCha8([32]byte{7}), n: n, err: err}
}

func (s *source) Read(b []byte) (int, error) {
	if s.done >= s.n {
		return 0, s.err
	}
	b = b[:min(int64(len(b)), s.n-s.done, 50000)]
	_, _ = s.r.Read(b)
	if s.mid != nil && s.done < s.n/2 && s.done+int64(len(b)) >= s.n/2 {
		s.mid()
	}
	s.done += int64(len(b))
	return len(b), nil
}

// TestFiles writes and reads back files of a real container: several MiB
// streamed both ways (checksums), the mode, the owner (the container's
// root, 100000 on the host), parent directories made, an overwrite, an
// empty file, the size before the bytes, the cap (ErrTooLarge after
// exactly max bytes), a missing file, a directory, and a write whose
// source fails or whose context ends, which leaves neither the target
// nor a temporary file.
func TestFiles(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	e := startCTs(ctx, t, testvm.ContainerSpec{VMID: 323})
	g := e.c.Guest(323)
	const size = 6<<20 + 123
	src := newSource(size, io.EOF)
	want := sha256.New()
	if err := g.WriteFile(ctx, "/data/sub/big", io.TeeReader(src, want), 0o640); err != nil {
		t.Fatal(err)
	}
	if got := e.sh(ctx, t, 323, "stat -c '%a %u %s' /data/sub/big"); got != fmt.Sprintf("640 0 %d\n", size) {
		t.Errorf("mode, owner, size: %q", got)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/root/data/sub/big", e.cts[323].PID), &st); err != nil || st.Uid != testvm.CTIDOffset {
		t.Errorf("host owner %d, %v", st.Uid, err)
	}
	got := sha256.New()
	var sized int64 = -1
	n, err := g.ReadFileSized(ctx, "/data/sub/big", writerFunc(func(b []byte) (int, error) {
		if sized != size {
			t.Errorf("bytes before the size (%d)", sized)
		}
		return got.Write(b)
	}), 0, func(n int64) error { sized = n; return nil })
	if err != nil || n != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Errorf("read back %d bytes, %v; same bytes: %v", n, err, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
	head := e.sh(ctx, t, 323, "head -c 1000 /data/sub/big")
	for _, c := range []struct {
		name string
		max  int64
		n    int64
		err  error
	}{
		{"cap passed", 1000, 1000, sandbox.ErrTooLarge},
		{"cap one short", size - 1, size - 1, sandbox.ErrTooLarge},
		{"cap met", size, size, nil},
	} {
		var buf bytes.Buffer
		n, err := g.ReadFile(ctx, "/data/sub/big", &buf, c.max)
		if n != c.n || int64(buf.Len()) != c.n || !errors.Is(err, c.err) || c.err == nil && err != nil || !strings.HasPrefix(buf.String(), head) {
			t.Errorf("%s: %d bytes (%d written), %v", c.name, n, buf.Len(), err)
		}
	}
	sizeErr := errors.New("too big for the caller")
	if n, err := g.ReadFileSized(ctx, "/data/sub/big", io.Discard, 0, func(int64) error { return sizeErr }); n != 0 || err != sizeErr {
		t.Errorf("a size refused: %d, %v", n, err)
	}
	for _, c := range []struct {
		name, data string
		mode       os.FileMode
		stat       string
	}{
		{"overwrite", "bb", 0o600, "600 2"},
		{"empty", "", 0o644, "644 0"},
	} {
		if err := g.WriteFile(ctx, "/data/sub/f", strings.NewReader(c.data), c.mode); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := e.sh(ctx, t, 323, "stat -c '%a %s' /data/sub/f; cat /data/sub/f"); got != c.stat+"\n"+c.data {
			t.Errorf("%s: %q", c.name, got)
		}
	}
	for _, c := range []struct {
		name string
		err  error
		do   func() error
	}{
		{"read missing", sandbox.ErrFileNotFound, func() error { _, err := g.ReadFile(ctx, "/data/nothing", io.Discard, 0); return err }},
		{"read below a file", sandbox.ErrFileNotFound, func() error { _, err := g.ReadFile(ctx, "/data/sub/f/x", io.Discard, 0); return err }},
		{"read a directory", sandbox.ErrIsDirectory, func() error { _, err := g.ReadFile(ctx, "/data", io.Discard, 0); return err }},
		{"write a directory", sandbox.ErrIsDirectory, func() error { return g.WriteFile(ctx, "/data/sub", strings.NewReader("x"), 0o644) }},
		{"relative path", sandbox.ErrGuestInvalid, func() error { return g.WriteFile(ctx, "data/x", strings.NewReader("x"), 0o644) }},
		{"mode bits", sandbox.ErrGuestInvalid, func() error { return g.WriteFile(ctx, "/data/x", strings.NewReader("x"), os.ModeSetuid|0o755) }},
	} {
		if err := c.do(); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	if err := g.WriteFile(ctx, "/data/sub/f/x", strings.NewReader("x"), 0o644); err == nil {
		t.Error("a write below a file succeeded")
	}
	testBrokenWrites(ctx, t, e)
}

// testBrokenWrites: a write whose source fails, or whose context ends,
// half-way leaves neither the target nor a temporary file.
func testBrokenWrites(ctx context.Context, t *testing.T, e *bedCTs) {
	g := e.c.Guest(323)
	srcErr := errors.New("the client went away")
	err := g.WriteFile(ctx, "/data/broken/a", newSource(4<<20, srcErr), 0o644)
	if !errors.Is(err, srcErr) {
		t.Errorf("failing source: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	s := newSource(4<<20, io.EOF)
	s.mid = func() {
		// the rest of the source comes only once the cancel killed the
		// write's processes
		cancel()
		for range 600 {
			cgs := e.execCgroups(t, 323)
			if len(cgs) == 1 {
				if busy, _ := populated(cgs[0]); !busy {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Error("the cancelled write still runs")
	}
	if err := g.WriteFile(cctx, "/data/broken/b", s, 0o644); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled write: %v", err)
	}
	if got := e.sh(ctx, t, 323, "ls -A /data/broken"); got != "" {
		t.Errorf("left behind: %q", got)
	}
	e.nothingLeft(t, 323, "pve-inspect")
}
