package sandboxapi

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ListenUnix listens on a unix socket with the given group (name or
// number; "" keeps the process group) and mode, replacing a stale socket.
// The socket is bound under a temporary name, given its group and mode, and
// only then renamed into place, so it is never reachable with looser
// permissions.
func ListenUnix(path, group string, mode os.FileMode) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another process serves this socket", path)
		}
	}
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	_ = os.Remove(tmp)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0); err != nil {
		return fail(err)
	}
	if group != "" {
		gid, err := strconv.Atoi(group)
		if err != nil {
			g, err := user.LookupGroup(group)
			if err != nil {
				return fail(err)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
		if err := shareDir(dirOf(path), gid); err != nil {
			return fail(err)
		}
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: ul, path: path}, nil
}

// shareDir lets group gid reach the socket in dir: a directory others
// cannot traverse (the unit's RuntimeDirectoryMode=0750) gets group gid and
// group traverse only (0710), so members can open the socket by name but
// not list the directory. A directory others can traverse is left alone.
// Changing a directory's group to one root is not a member of needs
// CAP_CHOWN, which the shipped unit grants for this.
func shareDir(dir string, gid int) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	perm := fi.Mode().Perm()
	if perm&0o001 != 0 {
		return nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Gid) != gid {
		if err := os.Chown(dir, -1, gid); err != nil {
			return fmt.Errorf("give the socket directory to group %d: %w", gid, err)
		}
	}
	if want := perm&^0o070 | 0o010; want != perm {
		if err := os.Chmod(dir, want); err != nil {
			return fmt.Errorf("socket directory mode: %w", err)
		}
	}
	return nil
}

// unixListener removes its socket file on Close.
type unixListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { _ = os.Remove(l.path) })
	return err
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return "."
}

// TLSConfig loads a certificate and key (the node's pve-ssl.pem by default)
// and reloads them when the files change.
func TLSConfig(certFile, keyFile string) (*tls.Config, error) {
	var mu sync.Mutex
	var cur *tls.Certificate
	var stamp time.Time
	load := func() (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		fi, err := os.Stat(certFile)
		if err != nil {
			return nil, err
		}
		if cur != nil && !fi.ModTime().After(stamp) {
			return cur, nil
		}
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cur, stamp = &c, fi.ModTime()
		return cur, nil
	}
	if _, err := load(); err != nil {
		return nil, fmt.Errorf("load TLS key pair: %w", err)
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return load() },
	}, nil
}

// Serve serves h on ln until ctx ends, then shuts down gracefully.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	}
}
