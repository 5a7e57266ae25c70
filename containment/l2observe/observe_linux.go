package l2observe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/nsrun"
)

// Observer watches bridges. The zero value is not usable: call New.
type Observer struct {
	ns    netns.NsHandle // the bridge's namespace when hasNS
	hasNS bool
}

// Option configures an Observer.
type Option func(*Observer)

// WithNetNS watches bridges in the network namespace ns (the test bed's
// node); the caller keeps ns open while the Observer is used.
func WithNetNS(ns netns.NsHandle) Option {
	return func(o *Observer) { o.ns, o.hasNS = ns, true }
}

// New returns an Observer of the caller's network namespace, or of the
// one WithNetNS names.
func New(opts ...Option) *Observer {
	o := &Observer{}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// watched is one packet socket on one interface.
type watched struct {
	name     string
	fd       int
	outgoing bool // count frames the node transmits (ports), else frames it receives (the bridge)
}

// Observe watches q.Bridge and its other ports, runs during, goes on
// watching for q.Linger and returns what was seen. during's error is
// returned with the sightings; a failure to watch is an error and the
// sightings are then empty. during is not called when the watch cannot
// start.
func (o *Observer) Observe(ctx context.Context, q Query, during func(context.Context) error) (Sightings, error) {
	if err := q.validate(); err != nil {
		return Sightings{}, err
	}
	socks, bridgeMAC, err := o.open(q)
	if err != nil {
		return Sightings{}, err
	}
	ports := make([]string, 0, len(socks))
	for _, s := range socks[1:] {
		ports = append(ports, s.name)
	}
	rec := newRecorder(q, bridgeMAC, ports)

	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make([]error, len(socks))
	for i, s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.read(&stop, rec)
		}()
	}
	werr := during(ctx)
	linger := q.Linger
	if linger <= 0 {
		linger = DefaultLinger
	}
	select {
	case <-ctx.Done():
	case <-time.After(linger):
	}
	stop.Store(true)
	wg.Wait()
	for i, s := range socks {
		if errs[i] == nil {
			errs[i] = s.drops()
		}
		unix.Close(s.fd)
	}
	if err := errors.Join(errs...); err != nil {
		return Sightings{}, fmt.Errorf("l2observe: %w", err)
	}
	if ctx.Err() != nil && werr == nil {
		return Sightings{}, fmt.Errorf("l2observe: watch cut short: %w", ctx.Err())
	}
	return rec.sightings(), werr
}

// open finds the bridge and its ports and opens one socket per interface
// (the bridge first), in the observer's namespace.
func (o *Observer) open(q Query) ([]watched, net.HardwareAddr, error) {
	var socks []watched
	var mac net.HardwareAddr
	err := o.inNS(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
		br, err := h.LinkByName(q.Bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", q.Bridge, err)
		}
		if br.Type() != "bridge" {
			return fmt.Errorf("%s is a %s, not a bridge", q.Bridge, br.Type())
		}
		mac = br.Attrs().HardwareAddr
		links, err := h.LinkList()
		if err != nil {
			return fmt.Errorf("links: %w", err)
		}
		want := []watched{{name: q.Bridge}}
		idx := []int{br.Attrs().Index}
		for _, l := range links {
			a := l.Attrs()
			if a.MasterIndex != br.Attrs().Index || slices.Contains(q.Exclude, a.Name) {
				continue
			}
			want = append(want, watched{name: a.Name, outgoing: true})
			idx = append(idx, a.Index)
		}
		for i, w := range want {
			fd, err := packetSocket(idx[i])
			if err != nil {
				return fmt.Errorf("watch %s: %w", w.name, err)
			}
			w.fd = fd
			socks = append(socks, w)
		}
		return nil
	})
	if err != nil {
		for _, s := range socks {
			unix.Close(s.fd)
		}
		return nil, nil, fmt.Errorf("l2observe: %w", err)
	}
	return socks, mac, nil
}

// inNS runs fn in the observer's namespace (nsrun.Do).
func (o *Observer) inNS(fn func() error) error {
	if !o.hasNS {
		return fn()
	}
	return nsrun.Do(&o.ns, fn)
}

// packetSocket opens a packet socket receiving every frame of interface
// ifindex. It is bound with the protocol at bind time, so it receives
// nothing from other interfaces before.
func packetSocket(ifindex int) (int, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	tv := unix.Timeval{Usec: 50_000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("receive timeout: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20) // best effort: the kernel caps it
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind: %w", err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// read records frames until stop is set. The socket's receive timeout
// bounds each wait, so stop is noticed within it.
func (w watched) read(stop *atomic.Bool, rec *recorder) error {
	buf := make([]byte, 2048) // a nonce or an ARP body sits in the first bytes
	for !stop.Load() {
		n, from, err := unix.Recvfrom(w.fd, buf, 0)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read %s: %w", w.name, err)
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || (ll.Pkttype == unix.PACKET_OUTGOING) != w.outgoing {
			continue
		}
		rec.record(w.name, buf[:n])
	}
	return nil
}

// drops fails when the kernel dropped frames for the socket (its buffer
// ran full): a dropped frame could be the one looked for.
func (w watched) drops() error {
	st, err := unix.GetsockoptTpacketStats(w.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		return fmt.Errorf("statistics of %s: %w", w.name, err)
	}
	if st.Drops > 0 {
		return fmt.Errorf("watch on %s dropped %d frames: absence is not proven", w.name, st.Drops)
	}
	return nil
}
