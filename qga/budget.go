package qga

import (
	"errors"
	"fmt"
	"sync"
)

// DefaultBudget is the node-wide budget of reply-buffer bytes a Client
// takes when Options.Budget is nil: 256 MiB, an eighth of the daemon
// unit's MemoryMax (2 GiB, packaging/deb/pve-inspectd.service), so that
// with the decoded copies of the replies (README, "What each owner is
// guaranteed") it stays well under it. Each owner's share defaults to a
// quarter of the budget, so four owners at their full share fit.
const DefaultBudget = 256 << 20

// ErrBudget is returned (wrapped) by a call whose reply would pass the
// node-wide budget of buffered guest bytes: the daemon is busy with other
// guests' replies, not the guest's fault; retry later. ErrOwnerBudget:
// the call's owner holds its whole share with its other calls.
var (
	ErrBudget      = errors.New("node-wide budget of buffered guest bytes exhausted")
	ErrOwnerBudget = errors.New("owner's share of the buffered guest bytes exhausted")
)

// Budget bounds the bytes the reply buffers of every connection hold
// together, across every VM and every Client that shares it, and the part
// of them held for one owner (the owner a call's context is marked with,
// sandbox.WithOwner; calls without one are held to one share together,
// apart from every owner's, so that no call escapes the share rule): a
// buffer grows only by taking bytes from it, and gives them back when its
// connection closes. The owners' shares follow the rule of the API's
// quotas (sandboxapi/quota.go): with seats = max / share whole shares,
// the owners together hold past their shares at most max mod share (none
// with the defaults), so while fewer than seats owners hold bytes every
// owner arriving finds its whole share and every holder can fill its own
// (the calls without an owner take a seat like an owner).
// A reply larger than the share (plus that remainder) is refused for good
// with ErrOwnerBudget. A grow that would pass a bound fails at once
// rather than waiting: connections that each hold part of the budget and
// wait for more would stall one another until their deadlines. Safe for
// concurrent use.
type Budget struct {
	max, share int64

	mu      sync.Mutex
	used    int64
	peak    int64
	excess  int64 // held past their shares by the owners together
	byOwner map[string]int64
	unowned int64 // held for calls of no owner
}

// NewBudget returns a budget of max bytes (max <= 0: DefaultBudget) of
// which one owner may hold share (share <= 0: a quarter of max).
func NewBudget(max, share int64) *Budget {
	if max <= 0 {
		max = DefaultBudget
	}
	if share <= 0 {
		share = max / 4
	}
	return &Budget{max: max, share: share, byOwner: map[string]int64{}}
}

// Max is the budget's size in bytes; Share one owner's part of it.
func (b *Budget) Max() int64   { return b.max }
func (b *Budget) Share() int64 { return b.share }

// Used is the bytes the reply buffers hold now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Peak is the high-water mark of Used.
func (b *Budget) Peak() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}

// take takes n bytes for owner (when owned; else for the calls of no
// owner, which hold one share together like an owner), or fails without
// taking any when that would pass the total (ErrBudget) or the owner's
// share (ErrOwnerBudget; past their shares the owners, the calls of no
// owner among them, may hold max mod share together). A negative n gives
// bytes back and never fails.
func (b *Budget) take(owner string, owned bool, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.byOwner[owner]
	if !owned {
		held = b.unowned
	}
	over := func(h int64) int64 { return max(0, h-b.share) }
	excess := b.excess + over(held+n) - over(held)
	if n > 0 {
		if b.used+n > b.max {
			return fmt.Errorf("%w: %d bytes held, %d more asked, budget %d", ErrBudget, b.used, n, b.max)
		}
		if excess > b.max%b.share {
			return fmt.Errorf("%w: %d bytes held for the owner, %d more asked, share %d", ErrOwnerBudget, held, n, b.share)
		}
	}
	b.used += n
	b.peak = max(b.peak, b.used)
	b.excess = excess
	if !owned {
		b.unowned += n
	} else if b.byOwner[owner] = held + n; b.byOwner[owner] <= 0 {
		delete(b.byOwner, owner)
	}
	return nil
}
