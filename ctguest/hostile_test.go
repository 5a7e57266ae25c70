package ctguest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// read is ReadFile into a string.
func read(ctx context.Context, g *Guest, p string, max int64) (string, error) {
	var b bytes.Buffer
	_, err := g.ReadFile(ctx, p, &b, max)
	return b.String(), err
}

// TestHostileContainer: a container's root prepares traps for the
// daemon's file calls and tools; every path resolves in the container's
// mount namespace with its credentials, and a container that breaks its
// own tools only breaks its own answers.
func TestHostileContainer(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	e := startCTs(ctx, t, testvm.ContainerSpec{VMID: 331, Hostname: "ctg-victim"}, testvm.ContainerSpec{VMID: 332, Hostname: "ctg-bystander"})
	g := e.c.Guest(331)
	hostDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hostDir, "secret"), []byte("HOST-ONLY\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostShadow, err := os.ReadFile("/etc/shadow")
	if err != nil {
		t.Fatal(err)
	}
	ctShadow, err := read(ctx, g, "/etc/shadow", 0)
	if err != nil || ctShadow == string(hostShadow) {
		t.Fatalf("the container's /etc/shadow: %v (the same as the host's: %v)", err, ctShadow == string(hostShadow))
	}
	e.sh(ctx, t, 331, `ln -s "$1/secret" /hostlink && ln -s /etc/shadow /shadowlink && ln -s "$1/target" /wlink && ln -s "$1" /wdir && mkfifo /fifo`, hostDir)

	t.Run("read through links", func(t *testing.T) {
		if got, err := read(ctx, g, "/hostlink", 0); !errors.Is(err, sandbox.ErrFileNotFound) {
			t.Errorf("a link to a host-only path: %q, %v", got, err)
		}
		e.sh(ctx, t, 331, `mkdir -p "$1" && echo CT-VIEW > "$1/secret"`, hostDir)
		for _, c := range []struct{ path, want string }{
			{"/hostlink", "CT-VIEW\n"},
			{"/shadowlink", ctShadow},
			{"/proc/1/root/etc/shadow", ctShadow},
			{"/proc/self/root/etc/shadow", ctShadow},
			{"/proc/1/root/etc/hostname", "ctg-victim\n"},
			{"/proc/1/cwd/etc/hostname", "ctg-victim\n"},
			{"/proc/self/root" + hostDir + "/secret", "CT-VIEW\n"},
		} {
			if got, err := read(ctx, g, c.path, 0); err != nil || got != c.want {
				t.Errorf("%s: %q, %v; want the container's %q", c.path, got, err, c.want)
			}
		}
	})
	t.Run("write through links", func(t *testing.T) {
		if err := g.WriteFile(ctx, "/wlink", strings.NewReader("x"), 0o644); err != nil {
			t.Error(err)
		}
		err := g.WriteFile(ctx, "/wdir/f", strings.NewReader("x"), 0o644)
		t.Logf("a write below a link to a host directory: %v", err)
		if ents, _ := os.ReadDir(hostDir); len(ents) != 1 {
			t.Errorf("the host directory holds %v", ents)
		}
		if got := e.sh(ctx, t, 331, `[ -f /wlink ] && [ ! -L /wlink ] && cat /wlink`); got != "x" {
			t.Errorf("/wlink in the container: %q", got)
		}
	})
	t.Run("FIFO", func(t *testing.T) {
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if got, err := read(fctx, g, "/fifo", 0); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a FIFO: %q, %v", got, err)
		}
		e.nothingLeft(t, 331, "/fifo")
	})
	t.Run("descriptors", func(t *testing.T) { testDescriptors(ctx, t, e, hostDir) })
	t.Run("broken cat", func(t *testing.T) {
		e.sh(ctx, t, 331, `cp /bin/cat /bin/cat.orig && printf '#!/bin/sh\nexec yes\n' > /bin/cat`)
		defer e.raw(ctx, t, 331, "/bin/mv", "/bin/cat.orig", "/bin/cat")
		if got, err := read(ctx, g, "/etc/hostname", 1<<20); !errors.Is(err, sandbox.ErrTooLarge) || len(got) != 1<<20 {
			t.Errorf("cat says yes: %d bytes, %v", len(got), err)
		}
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := g.ReadFile(fctx, "/etc/hostname", io.Discard, 0); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("cat says yes, no cap: %v", err)
		}
		if got, err := read(ctx, e.c.Guest(332), "/etc/hostname", 0); err != nil || got != "ctg-bystander\n" {
			t.Errorf("the other container: %q, %v", got, err)
		}
		e.nothingLeft(t, 331, "yes")
	})
	t.Run("broken sh", func(t *testing.T) { testBrokenShell(ctx, t, e) })
}

// testDescriptors: a descriptor the daemon inherited without
// close-on-exec (from its parent or systemd) does not reach the
// container: an exec's shell has 0, 1 and 2 only, pipes.
func testDescriptors(ctx context.Context, t *testing.T, e *bedCTs, hostDir string) {
	fd, err := syscall.Open(filepath.Join(hostDir, "secret"), syscall.O_RDONLY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	// the shell's own descriptors, listed by its child
	got := e.sh(ctx, t, 331, `ls -l /proc/$$/fd`)
	t.Logf("an exec's descriptors:\n%s", got)
	var fds []string
	for _, l := range strings.Split(got, "\n") {
		if _, link, ok := strings.Cut(l, " -> "); ok {
			f := strings.Fields(l[:strings.Index(l, " -> ")])
			fds = append(fds, f[len(f)-1]+" "+link)
		}
	}
	if len(fds) != 3 {
		t.Fatalf("descriptors %q, want 0, 1 and 2", fds)
	}
	for i, l := range fds {
		if !strings.HasPrefix(l, string(rune('0'+i))+" pipe:[") {
			t.Errorf("descriptor %q, want a pipe", l)
		}
	}
	if _, err := os.Stat(filepath.Join(hostDir, "secret")); err != nil {
		t.Fatal(err)
	}
}

// testBrokenShell: a container whose /bin/sh hangs, prints garbage or
// floods after the marker gets bounded answers (a timeout, a protocol
// error, a cut stream), every process of those calls is killed, and the
// other container answers meanwhile.
func testBrokenShell(ctx context.Context, t *testing.T, e *bedCTs) {
	g := e.c.Guest(331)
	e.sh(ctx, t, 331, `printf '#!/bin/bash\nexec sleep 4343\n' > /usr/local/bin/hang
printf '#!/bin/bash\necho garbage; exec yes\n' > /usr/local/bin/garbage
printf '#!/bin/bash\necho "%s"; exec yes\n' "$1" > /usr/local/bin/flood
chmod 755 /usr/local/bin/hang /usr/local/bin/garbage /usr/local/bin/flood`, marker)
	defer e.raw(ctx, t, 331, "/bin/ln", "-sfn", "dash", "/bin/sh")
	tests := []struct {
		name, sh string
		want     error
		flood    bool
	}{
		{name: "hangs", sh: "/usr/local/bin/hang", want: sandbox.ErrGuestTimeout},
		{name: "garbage", sh: "/usr/local/bin/garbage", want: sandbox.ErrGuestProtocol},
		{name: "marker then a flood", sh: "/usr/local/bin/flood", flood: true},
	}
	for _, tt := range tests {
		e.raw(ctx, t, 331, "/bin/ln", "-sfn", tt.sh, "/bin/sh")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := read(ctx, e.c.Guest(332), "/etc/hostname", 0); err != nil || got != "ctg-bystander\n" {
				t.Errorf("%s: the other container: %q, %v", tt.name, got, err)
			}
		}()
		res, err := g.Exec(ctx, sandbox.GuestExec{Argv: []string{"true"}, Timeout: 2, OutputLimit: 1000})
		wg.Wait()
		switch {
		case tt.flood:
			if err != nil || !res.TimedOut || !res.StdoutTruncated || len(res.Stdout) != 1000 {
				t.Errorf("%s: %v, %v", tt.name, res, err)
			}
		case !errors.Is(err, tt.want):
			t.Errorf("%s: %v, %v; want %v", tt.name, res, err, tt.want)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := g.Ping(pctx); err == nil {
			t.Errorf("%s: ping answered", tt.name)
		}
		cancel()
		e.nothingLeft(t, 331, "4343")
		e.nothingLeft(t, 331, "yes")
	}
}
