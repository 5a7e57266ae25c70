package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Extend sets a ready sandbox's expiry to now+ttl.
func (m *Engine) Extend(id string, ttl time.Duration) (apitype.Sandbox, error) {
	m.mu.Lock()
	r, ok := m.sbx[id]
	if !ok {
		m.mu.Unlock()
		return apitype.Sandbox{}, refuse(ErrUnknown, "sandbox %q not found", id)
	}
	if r.State != apitype.StateReady {
		m.mu.Unlock()
		return apitype.Sandbox{}, r.notReady()
	}
	r.ExpiresAt = m.o.Now().Add(ttl)
	sb := cloneSandbox(r.Sandbox)
	m.mu.Unlock()
	return sb, m.saveState()
}

// RunReaper deletes expired sandboxes until ctx ends. Every
// ReaperInterval it starts the delete of each due sandbox not already
// being deleted, up to ReapParallel in flight and, when other owners have
// sandboxes due or in flight, at most ceil(ReapParallel/2) of one owner's:
// a delete that hangs holds its own slot, not the sandboxes that expire
// meanwhile. It returns after every delete it started has ended.
func (m *Engine) RunReaper(ctx context.Context) {
	t := time.NewTicker(m.o.ReaperInterval)
	defer t.Stop()
	rp := reaper{m: m, inFlight: map[string]string{}, perOwner: map[string]int{},
		done: make(chan string, m.o.ReapParallel)}
	defer rp.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-rp.done:
			rp.ended(id)
		case <-t.C:
			rp.start(ctx)
		}
	}
}

// reaper is RunReaper's state, owned by its loop: the deletes it has
// started and not yet seen end.
type reaper struct {
	m        *Engine
	inFlight map[string]string // sandbox id -> owner
	perOwner map[string]int    // owner -> deletes in flight
	done     chan string       // ids whose delete ended; room for every one in flight
	wg       sync.WaitGroup
}

// ended forgets the delete of id.
func (rp *reaper) ended(id string) {
	owner := rp.inFlight[id]
	delete(rp.inFlight, id)
	if rp.perOwner[owner]--; rp.perOwner[owner] <= 0 {
		delete(rp.perOwner, owner)
	}
}

// start starts the deletes of due sandboxes not in flight, oldest expiry
// first, within ReapParallel and the per-owner share.
func (rp *reaper) start(ctx context.Context) {
	var cands []dueSandbox
	owners := map[string]bool{}
	for o := range rp.perOwner {
		owners[o] = true
	}
	for _, d := range rp.m.due() {
		if _, busy := rp.inFlight[d.id]; !busy {
			cands = append(cands, d)
			owners[d.owner] = true
		}
	}
	limit := rp.m.o.ReapParallel
	share := limit
	if len(owners) > 1 {
		share = (limit + 1) / 2
	}
	for _, d := range cands {
		if len(rp.inFlight) >= limit {
			return
		}
		if rp.perOwner[d.owner] >= share {
			continue
		}
		rp.inFlight[d.id] = d.owner
		rp.perOwner[d.owner]++
		rp.wg.Go(func() {
			rp.m.reapOne(ctx, d.id)
			rp.done <- d.id // never blocks: done has room for every delete in flight
		})
	}
}

// dueSandbox is a sandbox past its expiry.
type dueSandbox struct {
	id, owner string
	expires   time.Time
}

// due lists the sandboxes past their expiry, oldest expiry first.
func (m *Engine) due() []dueSandbox {
	now := m.o.Now()
	var due []dueSandbox
	m.mu.Lock()
	for id, r := range m.sbx {
		if (r.State == apitype.StateReady || r.State == apitype.StateError) && !now.Before(r.ExpiresAt) {
			due = append(due, dueSandbox{id: id, owner: r.Owner, expires: r.ExpiresAt})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(due, func(a, b dueSandbox) int {
		if c := a.expires.Compare(b.expires); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	return due
}

// Reap deletes every sandbox past its expiry once, up to ReapParallel at
// a time, and waits for those deletes; it returns how many it deleted.
// The daemon runs RunReaper, which does not wait for a pass to end.
func (m *Engine) Reap(ctx context.Context) int {
	var (
		n    atomic.Int64
		wg   sync.WaitGroup
		slot = make(chan struct{}, m.o.ReapParallel)
	)
	for _, d := range m.due() {
		slot <- struct{}{}
		wg.Go(func() {
			defer func() { <-slot }()
			if m.reapOne(ctx, d.id) {
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}

// reapOne deletes the expired sandbox id within TeardownTimeout. It is
// checked again under the lock as it turns to deleting: one extended
// since the list was made is left alone. The expired event goes out after
// the lock is released (removeIf's announce), before the teardown.
func (m *Engine) reapOne(ctx context.Context, id string) bool {
	var ev apitype.Event
	expired := func(r *record) *goneWhy {
		if (r.State != apitype.StateReady && r.State != apitype.StateError) || m.o.Now().Before(r.ExpiresAt) {
			return nil
		}
		exp := r.ExpiresAt
		ev = apitype.Event{Type: apitype.EventExpired, Sandbox: r.ID, Owner: r.Owner, ExpiresAt: &exp}
		return &goneWhy{reason: apitype.ReasonExpired, why: fmt.Sprintf("it expired at %s (its TTL ran out and nothing extended it)", exp.UTC().Format(time.RFC3339))}
	}
	announce := func() { m.emit(ev) }
	rctx, cancel := context.WithTimeout(ctx, m.o.TeardownTimeout)
	defer cancel()
	deleted, err := m.removeIf(rctx, id, expired, announce, nil)
	switch {
	case err != nil:
		m.log.Error("reaper: delete expired sandbox", "sandbox", id, "err", err)
		return false
	case !deleted:
		m.log.Info("reaper: sandbox extended meanwhile; kept", "sandbox", id)
		return false
	}
	m.met.reaped.Inc()
	m.log.Info("reaper: deleted expired sandbox", "sandbox", id)
	return true
}
