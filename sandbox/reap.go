package sandbox

import (
	"context"
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
		return apitype.Sandbox{}, refuse(ErrConflict, "sandbox %q is %s", id, r.State)
	}
	r.ExpiresAt = m.o.Now().Add(ttl)
	sb := cloneSandbox(r.Sandbox)
	m.mu.Unlock()
	return sb, m.saveState()
}

// RunReaper deletes expired sandboxes every ReaperInterval until ctx ends.
func (m *Engine) RunReaper(ctx context.Context) {
	t := time.NewTicker(m.o.ReaperInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Reap(ctx)
		}
	}
}

// Reap deletes every sandbox past its expiry once, up to ReapParallel at
// a time; it returns how many it deleted.
func (m *Engine) Reap(ctx context.Context) int {
	now := m.o.Now()
	var due []string
	m.mu.Lock()
	for id, r := range m.sbx {
		if (r.State == apitype.StateReady || r.State == apitype.StateError) && !now.Before(r.ExpiresAt) {
			due = append(due, id)
		}
	}
	m.mu.Unlock()
	var (
		n    atomic.Int64
		wg   sync.WaitGroup
		slot = make(chan struct{}, m.o.ReapParallel)
	)
	for _, id := range due {
		slot <- struct{}{}
		wg.Go(func() {
			defer func() { <-slot }()
			if m.reapOne(ctx, id) {
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
	expired := func(r *record) bool {
		due := (r.State == apitype.StateReady || r.State == apitype.StateError) && !m.o.Now().Before(r.ExpiresAt)
		if due {
			exp := r.ExpiresAt
			ev = apitype.Event{Type: apitype.EventExpired, Sandbox: r.ID, Owner: r.Owner, ExpiresAt: &exp}
		}
		return due
	}
	announce := func() { m.emit(ev) }
	rctx, cancel := context.WithTimeout(ctx, m.o.TeardownTimeout)
	defer cancel()
	deleted, err := m.removeIf(rctx, id, expired, announce)
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
