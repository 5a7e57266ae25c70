package tenantbed

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// NodeAPIPort is the Proxmox API's port on the node (the emulator's
// listener in the playground).
const NodeAPIPort = 8006

// probeTimeout bounds one probe: a stalled service fails the probe
// instead of hanging the caller.
const probeTimeout = 60 * time.Second

// Received is an event of the prober's stream and when it arrived.
type Received struct {
	apitype.Event
	At time.Time
}

// Prober is the well-behaved tenant: its client, one of its sandboxes and
// its event stream, which follows everything its token may see from
// NewProber on. Close it.
type Prober struct {
	n  *Node
	c  *client.Client
	sb apitype.Sandbox
	vm string
	ns string
	hc *http.Client // to the node's API from the uplink

	cancel context.CancelFunc
	done   chan error
	closed sync.Once
	err    error // the stream's end, once closed

	mu     sync.Mutex // guards events
	events []Received
}

// NewProber starts c's event stream and probes sb, whose first VM's guest
// sends the DNS and proxy probes.
func NewProber(ctx context.Context, n *Node, c *client.Client, sb apitype.Sandbox) (*Prober, error) {
	if len(sb.VMs) == 0 {
		return nil, errors.New("tenantbed: prober: sandbox without VMs")
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Prober{n: n, c: c, sb: sb, vm: sb.VMs[0].Name, ns: n.GuestNS(sb.VMs[0].VMID), cancel: cancel, done: make(chan error, 1)}
	p.hc = &http.Client{Timeout: probeTimeout, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the emulator's self-signed certificate; reachability and timing only
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialIn(ctx, n.UplinkNS(), network, addr)
		}}}
	// The stream resumes from the first event buffered (Last-Event-ID 0),
	// not from the newest when it is served: an event published before
	// the request was served (a loaded node) is still received, so no
	// probe depends on how soon the stream opened.
	go func() {
		p.done <- c.Events(sctx, client.EventsRequest{Resume: true}, func(e apitype.Event) error {
			p.mu.Lock()
			p.events = append(p.events, Received{Event: e, At: time.Now()})
			p.mu.Unlock()
			return nil
		})
	}()
	return p, nil
}

// Close stops the event stream and returns its error (nil when it ran
// until Close); later calls return the same.
func (p *Prober) Close() error {
	p.closed.Do(func() {
		p.cancel()
		p.err = <-p.done
		if errors.Is(p.err, context.Canceled) {
			p.err = nil
		}
	})
	return p.err
}

// Events returns the events received so far.
func (p *Prober) Events() []Received {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Received(nil), p.events...)
}

// StreamErr returns the stream's error if it has ended, nil while it runs.
func (p *Prober) StreamErr() error {
	select {
	case err := <-p.done:
		p.done <- err
		if err == nil {
			return errors.New("tenantbed: the event stream ended")
		}
		return err
	default:
		return nil
	}
}

func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// Exec runs `true` (argv only) in the prober's VM.
func (p *Prober) Exec(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return timed(func() error {
		res, err := p.c.Exec(ctx, p.sb.ID, p.vm, apitype.ExecRequest{Argv: []string{"true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		return err
	})
}

// File writes a small file into the prober's VM and reads it back.
func (p *Prober) File(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	want := "tenant b " + randHex(8) + "\n"
	return timed(func() error {
		path := "/var/tmp/tenant-b-probe"
		if err := p.c.WriteFile(ctx, p.sb.ID, p.vm, path, strings.NewReader(want), int64(len(want)), 0o600); err != nil {
			return err
		}
		var got bytes.Buffer
		if _, err := p.c.ReadFile(ctx, p.sb.ID, p.vm, path, &got); err != nil {
			return err
		}
		if got.String() != want {
			return fmt.Errorf("read back %q, wrote %q", got.String(), want)
		}
		return nil
	})
}

// dnsAttempts and dnsTimeout are a stub resolver's (glibc's defaults:
// resolv.conf(5) attempts:2, timeout:5): one lost datagram is not an
// outage.
const (
	dnsAttempts = 2
	dnsTimeout  = 5 * time.Second
)

// Resolve asks name from the prober's guest (the guard hands DNS of an
// allow-list zone to the daemon's resolver), as a stub resolver does,
// and returns the time to the answer, its rcode and A records.
func (p *Prober) Resolve(name string) (time.Duration, int, []string, error) {
	var d time.Duration
	var rcode int
	var addrs []string
	err := Do(p.ns, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		start := time.Now()
		var resp *dns.Msg
		var err error
		for range dnsAttempts {
			if resp, _, err = (&dns.Client{Timeout: dnsTimeout}).Exchange(m, testvm.InternetAddr+":53"); err == nil {
				break
			}
		}
		d = time.Since(start)
		if err != nil {
			return err
		}
		rcode = resp.Rcode
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				addrs = append(addrs, a.A.String())
			}
		}
		return nil
	})
	return d, rcode, addrs, err
}

// DNS resolves a fresh name under the bed's internet name (allowed by the
// prober's policy) and wants the internet host's address.
func (p *Prober) DNS(context.Context) (time.Duration, error) {
	d, rcode, addrs, err := p.Resolve("b" + randHex(5) + "." + testvm.InternetName)
	if err == nil && (rcode != dns.RcodeSuccess || len(addrs) == 0) {
		err = fmt.Errorf("rcode %s, answers %v", dns.RcodeToString[rcode], addrs)
	}
	return d, err
}

// HTTP sends one HTTP request with Host host from the prober's guest to
// the internet host's port 80 on a new connection and returns the status
// line (the proxy splices it when the policy allows host).
func (p *Prober) HTTP(host string, timeout time.Duration) (time.Duration, string, error) {
	var d time.Duration
	var status string
	err := Do(p.ns, func() error {
		start := time.Now()
		c, err := net.DialTimeout("tcp4", testvm.InternetAddr+":80", timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
			return err
		}
		status, err = bufio.NewReader(c).ReadString('\n')
		d = time.Since(start)
		status = strings.TrimSpace(status)
		return err
	})
	return d, status, err
}

// Proxy fetches the internet host's page through the proxy (a name the
// prober's policy allows, resolved first so its address is learned).
func (p *Prober) Proxy(ctx context.Context) (time.Duration, error) {
	name := "p" + randHex(5) + "." + testvm.InternetName
	if _, rcode, addrs, err := p.Resolve(name); err != nil || len(addrs) == 0 {
		return 0, fmt.Errorf("resolve %s first: rcode %s, answers %v, %v", name, dns.RcodeToString[rcode], addrs, err)
	}
	d, status, err := p.HTTP(name, 10*time.Second)
	if err == nil && !strings.HasPrefix(status, "HTTP/1.1 200") {
		err = fmt.Errorf("answer %q", status)
	}
	return d, err
}

// NodeAPI asks the node's Proxmox API (:8006 on the management address)
// for its version from the uplink, on a new connection; any HTTP answer
// counts.
func (p *Prober) NodeAPI(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return timed(func() error {
		req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("https://%s:%d/api2/json/version", testvm.NodeMgmtAddr, NodeAPIPort), nil)
		if err != nil {
			return err
		}
		resp, err := p.hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	})
}

// DaemonAPI gets the prober's sandbox through the daemon's TLS API.
func (p *Prober) DaemonAPI(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return timed(func() error {
		sb, err := p.c.Get(ctx, p.sb.ID)
		if err == nil && sb.ID != p.sb.ID {
			err = fmt.Errorf("got sandbox %q", sb.ID)
		}
		return err
	})
}

// EventCycle creates a sandbox of req's shape with the prober's client,
// deletes it, and waits for its created, ready and deleted events on the
// stream. It returns each one's publish-to-delivery time (arrival minus
// the event's time, both this machine's clock).
func (p *Prober) EventCycle(ctx context.Context, req apitype.CreateRequest) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*probeTimeout)
	defer cancel()
	sb, err := p.c.Create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	if err := p.c.Delete(ctx, sb.ID); err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	want := []string{apitype.EventCreated, apitype.EventReady, apitype.EventDeleted}
	for {
		var ds []time.Duration
		for _, typ := range want {
			for _, e := range p.Events() {
				if e.Sandbox == sb.ID && e.Type == typ {
					ds = append(ds, e.At.Sub(e.Time))
					break
				}
			}
		}
		if len(ds) == len(want) {
			return ds, nil
		}
		if err := p.StreamErr(); err != nil {
			return nil, fmt.Errorf("event stream: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("events of %s: %d of %v after %v: %w", sb.ID, len(ds), want, 3*probeTimeout, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
