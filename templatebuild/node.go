package templatebuild

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
	"github.com/pve-inspect/pve-inspect/qga"
)

// AgentSockets is an Agent that talks to each VM's guest agent socket
// <dir>/<vmid>.qga (Proxmox's own, /var/run/qemu-server) through c.
func AgentSockets(c *qga.Client, dir string) Agent { return socketAgent{c: c, dir: dir} }

type socketAgent struct {
	c   *qga.Client
	dir string
}

// Exec implements Agent: the command's output is capped at 64 KiB a
// stream, the call bounded by timeout and 30 s more.
func (a socketAgent) Exec(ctx context.Context, vmid int, argv []string, timeout time.Duration) (AgentResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	res, err := a.c.Agent(filepath.Join(a.dir, strconv.Itoa(vmid)+".qga")).Exec(ctx, qga.ExecRequest{Argv: argv, Timeout: timeout, OutputLimit: 64 << 10})
	if err != nil {
		return AgentResult{}, err
	}
	return AgentResult{Exit: res.ExitCode, Output: string(res.Stdout) + string(res.Stderr), TimedOut: res.TimedOut}, nil
}

// NodeHost is Host on the node the build runs on.
type NodeHost struct {
	// HTTPClient fetches checksum lists and image archives
	// (http.DefaultClient when nil).
	HTTPClient *http.Client
	// StateDir holds the build ledger (DefaultStateDir for the CLI).
	StateDir string
	// Redirect, when set, checks each redirect's target of Fetch before
	// it is followed (the daemon's URLGuard.Check: a mirror passed by the
	// guard must not send the daemon's own fetch to what the guard
	// refuses).
	Redirect func(ctx context.Context, url string) error
	// Stall bounds how long Open's body may bring no byte
	// (DefaultStall when 0).
	Stall time.Duration
}

// WriteFile implements Host (the directory is made when missing).
func (NodeHost) WriteFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o644)
}

// Remove implements Host.
func (NodeHost) Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Checksum implements Host.
func (NodeHost) Checksum(path, alg string) (string, error) {
	var h hash.Hash
	switch alg {
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		return "", fmt.Errorf("checksum algorithm %q", alg)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Fetch implements Host (one minute at most).
func (n NodeHost) Fetch(ctx context.Context, url string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := n.get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("GET %s: longer than %d bytes", url, limit)
	}
	return b, nil
}

// DefaultStall is how long Open's body may bring no byte before it fails.
const DefaultStall = 5 * time.Minute

// Open implements Host: the body ends with ctx, and fails when it brings
// no byte for Stall (DefaultStall when 0).
func (n NodeHost) Open(ctx context.Context, url string) (io.ReadCloser, int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	stall := n.Stall
	if stall <= 0 {
		stall = DefaultStall
	}
	timer := time.AfterFunc(stall, func() {
		cancel(fmt.Errorf("GET %s: no byte for %s", RedactURL(url), stall))
	})
	resp, err := n.get(ctx, url)
	if err != nil {
		timer.Stop()
		cancel(nil)
		if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
			err = c
		}
		return nil, 0, err
	}
	return &stallBody{ctx: ctx, rc: resp.Body, timer: timer, stall: stall, cancel: cancel}, resp.ContentLength, nil
}

// stallBody is a response body whose read pushes its stall timer back;
// the timer's firing cancels the request's context (the read fails with
// the cause). Close stops both.
type stallBody struct {
	ctx    context.Context
	rc     io.ReadCloser
	timer  *time.Timer
	stall  time.Duration
	cancel context.CancelCauseFunc
}

func (s *stallBody) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	if n > 0 {
		s.timer.Reset(s.stall)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if c := context.Cause(s.ctx); c != nil {
			err = c
		}
	}
	return n, err
}

func (s *stallBody) Close() error {
	s.timer.Stop()
	err := s.rc.Close()
	s.cancel(nil)
	return err
}

// get GETs url: 200 only, redirects checked (Redirect) and never from
// https to http.
func (n NodeHost) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	hc := http.DefaultClient
	if n.HTTPClient != nil {
		hc = n.HTTPClient
	}
	// Never from https to plain http on a redirect: the list is what the
	// image is verified against, the archive what it is unpacked from.
	c := *hc
	c.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if len(via) > 0 && via[0].URL.Scheme == "https" && r.URL.Scheme != "https" {
			return fmt.Errorf("redirect from %s to %s: not https", RedactURL(via[0].URL.String()), RedactURL(r.URL.String()))
		}
		if n.Redirect != nil {
			if err := n.Redirect(r.Context(), r.URL.String()); err != nil {
				return fmt.Errorf("redirect from %s: %w", RedactURL(via[len(via)-1].URL.String()), err)
			}
		}
		if hc.CheckRedirect != nil {
			return hc.CheckRedirect(r, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", RedactURL(url), resp.Status)
	}
	return resp, nil
}

// ErrBusy is returned by Lock while another build of the name runs.
var ErrBusy = errors.New("another build of this template runs")

// Lock takes the node-wide lock of the build of template name (an flock
// on dir/template-build-NAME.lock, dir made when missing): a second build
// of the name would take the first one's VM, tagged building, for a
// half-built one and destroy it. unlock releases it; the kernel does too
// when the process dies.
func Lock(dir, name string) (unlock func(), err error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	unlock, err = lockFile(dir, "template-build-"+name+".lock")
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("template %q: %w (%v)", name, ErrBusy, err)
	}
	return unlock, err
}

// errLocked is lockFile's refusal while another process holds the lock.
var errLocked = errors.New("held by another build")

// lockFile takes an flock on dir/base (dir made when missing) without
// waiting: errLocked (naming the file) while another holds it.
func lockFile(dir, base string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, base), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", f.Name(), errLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() { _ = f.Close() }, nil
}
