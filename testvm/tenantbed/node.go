// Package tenantbed is two tenants on the node in a box: the playground
// (`pve-inspect-demo --stay`: the test bed, the Proxmox API emulator on the
// node's :8006 and the real pve-inspectd with its guard, egress resolver
// and proxy, metrics and TLS API), owner-bound tokens for each tenant, a
// hostile tenant's attacks ([Attack]) and the probes of the tenant next
// to it ([Prober]). The two-tenant suite (sandboxapi/e2e/tenants) and the
// bench's neighbour section (bench/neighbour) use it. It talks to the
// daemon only through its HTTP API, as a tenant does. It needs root.
package tenantbed

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/deathsig"
	"github.com/pve-inspect/pve-inspect/internal/nsrun"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// MetricsPort is the playground daemon's metrics listener in the node's
// namespace (cmd/pve-inspect-demo writes [metrics] listen = 0.0.0.0:9474).
const MetricsPort = 9474

// Template is the playground's template name.
const Template = "debian"

// Node is a running playground. Close it.
type Node struct {
	bin     string
	cmd     *exec.Cmd
	done    chan error
	mu      sync.Mutex   // guards out
	out     bytes.Buffer // everything the playground printed
	info    map[string]string
	tlsCfg  *tls.Config
	apiHost string
	closed  sync.Once
}

// Start runs `pve-inspect-demo --stay` from bin (which also holds
// pve-inspectd and pve-inspect-probe) and waits for it to say it is ready.
func Start(ctx context.Context, bin string) (*Node, error) {
	for _, p := range []string{"pve-inspect-demo", "pve-inspectd", "pve-inspect-probe"} {
		if _, err := os.Stat(filepath.Join(bin, p)); err != nil {
			return nil, fmt.Errorf("tenantbed: %w (run `make build` first)", err)
		}
	}
	n := &Node{bin: bin, done: make(chan error, 1), info: map[string]string{}}
	n.cmd = exec.Command(filepath.Join(bin, "pve-inspect-demo"), "--stay", "--bin", bin, "--listen", "127.0.0.1:0")
	// Our own pipe, not StdoutPipe: deathsig's Wait runs at once and would
	// close StdoutPipe's read end under the reader when the child exits.
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	n.cmd.Stdout = w
	n.cmd.Stderr = &lockedWriter{mu: &n.mu, w: &n.out}
	// the playground tears its bed down on SIGTERM, also when we die
	waited, err := deathsig.Start(n.cmd, syscall.SIGTERM)
	w.Close()
	if err != nil {
		stdout.Close()
		return nil, fmt.Errorf("tenantbed: start playground: %w", err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			line := sc.Text()
			n.mu.Lock()
			n.out.WriteString(line + "\n")
			if k, v, ok := strings.Cut(line, " = "); ok && !strings.HasPrefix(line, " ") && !said {
				n.info[k] = v
			}
			n.mu.Unlock()
			if line == "playground ready" && !said {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
		stdout.Close()
		n.done <- <-waited
	}()
	select {
	case ok := <-ready:
		if !ok {
			n.closed.Do(func() { <-n.done })
			return nil, fmt.Errorf("tenantbed: playground exited before ready:\n%s", n.Output())
		}
	case <-ctx.Done():
		n.Close()
		return nil, fmt.Errorf("tenantbed: playground not ready: %w\n%s", ctx.Err(), n.Output())
	}
	if err := n.load(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// load reads the printed CA and API address.
func (n *Node) load() error {
	for _, k := range []string{"bed", "config", "api", "ca"} {
		if n.info[k] == "" {
			return fmt.Errorf("tenantbed: playground did not print %s:\n%s", k, n.Output())
		}
	}
	pem, err := os.ReadFile(n.info["ca"])
	if err != nil {
		return fmt.Errorf("tenantbed: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return errors.New("tenantbed: no certificate in the printed CA file")
	}
	u, err := url.Parse(n.info["api"])
	if err != nil {
		return fmt.Errorf("tenantbed: api %q: %w", n.info["api"], err)
	}
	n.tlsCfg, n.apiHost = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, u.Host
	return nil
}

// Output is everything the playground printed so far.
func (n *Node) Output() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out.String()
}

// Close stops the playground (SIGTERM; it tears the bed down) and waits
// for it, killing it after two minutes. Later calls do nothing.
func (n *Node) Close() {
	n.closed.Do(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(2 * time.Minute):
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	})
}

// NodeNS is the node's network namespace.
func (n *Node) NodeNS() string { return n.info["bed"] + "-node" }

// UplinkNS is the namespace behind the node's management NIC (where an
// operator's browser would be).
func (n *Node) UplinkNS() string { return n.info["bed"] + "-up" }

// GuestNS is the network namespace of guest vmid.
func (n *Node) GuestNS(vmid int) string { return fmt.Sprintf("%s-g%d", n.info["bed"], vmid) }

// Token creates an admin-scoped token bound to owner with the daemon's
// CLI and returns it.
func (n *Node) Token(ctx context.Context, name, owner string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", n.NodeNS(), filepath.Join(n.bin, "pve-inspectd"), "-c", n.info["config"],
		"token", "create", name, "--scope", "admin", "--owner", owner)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("tenantbed: token create %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Client is an API client over TLS with tok.
func (n *Node) Client(tok string) *client.Client {
	return client.NewTLS(n.apiHost, n.tlsCfg.Clone(), client.WithToken(tok))
}

// Do runs fn with its thread in the network namespace ns; sockets opened
// by fn stay in ns after it returns.
func Do(ns string, fn func() error) error {
	h, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("tenantbed: netns %s: %w", ns, err)
	}
	defer h.Close()
	return nsrun.Do(&h, fn)
}

// DialIn dials address from the namespace ns.
func DialIn(ctx context.Context, ns, network, address string) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Metrics scrapes the daemon's metrics endpoint inside the node.
func (n *Node) Metrics(ctx context.Context) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialIn(ctx, n.NodeNS(), network, addr)
		}}}
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", MetricsPort), nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("tenantbed: metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("tenantbed: metrics: %s", resp.Status)
	}
	return string(b), err
}

// Refused reports whether err is the daemon refusing a call for want of
// room: 429 (a quota) or 503 (a node-wide limit).
func Refused(err error) bool {
	var p *apitype.Problem
	return errors.As(err, &p) && (p.Status == http.StatusTooManyRequests || p.Status == http.StatusServiceUnavailable)
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
