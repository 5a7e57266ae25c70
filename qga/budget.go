package qga

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// DefaultBudget is the node-wide budget of reply-buffer bytes a Client
// takes when Options.Budget is nil: 256 MiB, an eighth of the daemon
// unit's MemoryMax (2 GiB, packaging/deb/pve-inspectd.service), so that
// with the decoded copies of the replies (README, "What each owner is
// guaranteed") it stays well under it.
const DefaultBudget = 256 << 20

// ErrBudget is returned (wrapped) by a call whose reply would pass the
// node-wide budget of buffered guest bytes: the daemon is busy with other
// guests' replies, not the guest's fault; retry later.
var ErrBudget = errors.New("node-wide budget of buffered guest bytes exhausted")

// Budget bounds the bytes the reply buffers of every connection hold
// together, across every VM and every Client that shares it: a buffer
// grows only by taking bytes from it, and gives them back when its
// connection closes. A grow that would pass the maximum fails at once
// (ErrBudget) rather than waiting: connections that each hold part of the
// budget and wait for more would stall one another until their deadlines.
// Safe for concurrent use.
type Budget struct {
	max        int64
	used, peak atomic.Int64
}

// NewBudget returns a budget of max bytes (max <= 0: DefaultBudget).
func NewBudget(max int64) *Budget {
	if max <= 0 {
		max = DefaultBudget
	}
	return &Budget{max: max}
}

// Max is the budget's size in bytes.
func (b *Budget) Max() int64 { return b.max }

// Used is the bytes the reply buffers hold now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Peak is the high-water mark of Used.
func (b *Budget) Peak() int64 { return b.peak.Load() }

// take takes n bytes, or fails without taking any when that would pass
// the maximum. A negative n gives bytes back and never fails.
func (b *Budget) take(n int64) error {
	for {
		u := b.used.Load()
		if n > 0 && u+n > b.max {
			return fmt.Errorf("%w: %d bytes held, %d more asked, budget %d", ErrBudget, u, n, b.max)
		}
		if b.used.CompareAndSwap(u, u+n) {
			for v := u + n; ; {
				p := b.peak.Load()
				if v <= p || b.peak.CompareAndSwap(p, v) {
					return nil
				}
			}
		}
	}
}
