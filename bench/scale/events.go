package scale

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// events follows the kernel's set element events of the node (nft
// monitor): the moment a member appears in or leaves a set is the moment
// the kernel committed it, with no polling beside the guard. Members are
// told apart by their keys (a zone pair is two padded names, 32 bytes;
// nothing else of the table has such keys).
type events struct {
	conn *nftables.Conn
	mon  *nftables.Monitor

	mu      sync.Mutex // guards waits and err
	waits   []*wait
	err     error
	stopped chan struct{}
}

// wait is one expectation: every key reaching present (or absent).
type wait struct {
	keys    map[string]bool // hex key -> still pending
	present bool
	at      map[string]time.Time // hex key -> when it got there
	done    chan struct{}
}

func newEvents(ns netns.NsHandle) (*events, error) {
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, fmt.Errorf("scale: monitor connection: %w", err)
	}
	// every object: the library's per-object filter tests its flags
	// with "flags&1<<type", which is (flags&1)<<type in Go, and passes
	// nothing but "any"; element events are picked out in loop
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(4096))
	ch, err := conn.AddMonitor(mon)
	if err != nil {
		return nil, fmt.Errorf("scale: monitor: %w", err)
	}
	e := &events{conn: conn, mon: mon, stopped: make(chan struct{})}
	go e.loop(ch)
	return e, nil
}

func (e *events) loop(ch chan *nftables.MonitorEvent) {
	defer close(e.stopped)
	for ev := range ch {
		at := time.Now()
		if ev.Error != nil {
			e.mu.Lock()
			e.err = fmt.Errorf("scale: nftables monitor: %w", ev.Error)
			e.mu.Unlock()
			continue
		}
		els, ok := ev.Data.([]nftables.SetElement)
		if !ok {
			continue
		}
		present := ev.Type == nftables.MonitorEventTypeNewSetElem
		e.mu.Lock()
		for _, el := range els {
			k := hex.EncodeToString(el.Key)
			for _, w := range e.waits {
				if w.present == present && w.keys[k] {
					delete(w.keys, k)
					w.at[k] = at
					if len(w.keys) == 0 {
						close(w.done)
					}
				}
			}
		}
		e.mu.Unlock()
	}
}

// expect registers, before the change is made, that every key will reach
// present; the returned function waits for it and returns when each key
// did, in the order given.
func (e *events) expect(present bool, keys ...[]byte) func(ctx context.Context, timeout time.Duration) ([]time.Time, error) {
	w := &wait{keys: map[string]bool{}, present: present, at: map[string]time.Time{}, done: make(chan struct{})}
	for _, k := range keys {
		w.keys[hex.EncodeToString(k)] = true
	}
	e.mu.Lock()
	e.waits = append(e.waits, w)
	e.mu.Unlock()
	return func(ctx context.Context, timeout time.Duration) ([]time.Time, error) {
		defer e.forget(w)
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-w.done:
			e.mu.Lock()
			defer e.mu.Unlock()
			out := make([]time.Time, len(keys))
			for i, k := range keys {
				out[i] = w.at[hex.EncodeToString(k)]
			}
			return out, nil
		case <-t.C:
			e.mu.Lock()
			defer e.mu.Unlock()
			return nil, errors.Join(fmt.Errorf("scale: %d of %d set members not seen within %v", len(w.keys), len(keys), timeout), e.err)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// latest is the last of ts.
func latest(ts []time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

func (e *events) forget(w *wait) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, x := range e.waits {
		if x == w {
			e.waits = append(e.waits[:i], e.waits[i+1:]...)
			return
		}
	}
}

func (e *events) close() {
	_ = e.mon.Close()
	<-e.stopped
	_ = e.conn.CloseLasting()
}

// ifname pads an interface name the way set keys hold it.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// pair is the @zone_peers key of (a, b).
func pair(a, b string) []byte { return append(ifname(a), ifname(b)...) }
