package sandboxapi

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// A shared resource of the guest I/O calls (exec slots, file slots, the
// collected-output bytes) has a node total and a per-owner share; the
// owner of a call is the owner of the sandbox it targets, whichever token
// calls, so one tenant's sandboxes share one share.
//
// The rule is deliberately simple. An owner never holds more exec or file
// slots than its share (a refusal is 429 too-many-requests with
// Retry-After: the owner's own load), except that an owner holding
// nothing of a resource may always take one call's worth, so a single
// call larger than the share is not refused for good. The node total is a
// hard cap on top (503 unavailable with Retry-After: the node is busy).
// The defaults make the node total four shares, so four owners at their
// full share fit and no single owner can take more than a quarter; a
// fifth owner is refused only while four others are all at their full
// share. A slot may be held for a day (exec timeouts go to 24 h), so no
// owner may exceed its slot share even while others are idle.
//
// The collected-output bytes also let an owner borrow: past its share
// (64 MiB: three collected execs at the default output limit, each
// reserving 2 x 10 MiB) it may take more while at least one full share of
// the node stays free after the take, so that the next owner to arrive
// still finds its share. Its exec-slot share bounds what it can borrow
// (eight execs at the default limit: 160 MiB of 256).

// quota is one resource's node total and per-owner share.
type quota struct {
	name        string // metric label: exec-slots, file-slots, collected-bytes
	node, share int64
	// borrow lets an owner past its share while a share of the node
	// stays free.
	borrow bool
	unit   string // what one is: "calls", "bytes"
	met    *metrics

	mu      sync.Mutex
	used    int64
	byOwner map[string]int64
}

func newQuota(name, unit string, node, share int64, borrow bool, met *metrics) *quota {
	return &quota{name: name, unit: unit, node: node, share: share, borrow: borrow, met: met, byOwner: map[string]int64{}}
}

// quotaRetry is the Retry-After of a quota refusal.
const quotaRetry = 5 * time.Second

// take takes n of the resource for owner, or refuses at once: 429 when the
// owner's share is used up, 503 when the node total is. Every refusal is
// counted. release gives n back.
func (q *quota) take(owner string, n int64) (release func(), err error) {
	key := ownerLabel(owner)
	q.mu.Lock()
	held := q.byOwner[key]
	switch {
	case held > 0 && held+n > q.share && (!q.borrow || q.node-(q.used+n) < q.share):
		q.mu.Unlock()
		q.met.countRefusal(owner, q.name)
		p := problemf(apitype.ProblemTooManyRequests,
			"owner %s holds %d of its share of %d %s (%s), %d more asked; retry when one of its calls ends", key, held, q.share, q.unit, q.name, n)
		p.Quota = q.name
		return nil, &retryError{p: p, after: quotaRetry}
	case q.used+n > q.node:
		used := q.used
		q.mu.Unlock()
		q.met.countRefusal(owner, "node-"+q.name)
		p := problemf(apitype.ProblemUnavailable,
			"%d of the node's %d %s (%s) in use, %d more asked; retry later", used, q.node, q.unit, q.name, n)
		p.Quota = q.name
		return nil, &retryError{p: p, after: quotaRetry}
	}
	q.used += n
	q.byOwner[key] = held + n
	q.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { q.give(key, n) }) }, nil
}

func (q *quota) give(key string, n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.used -= n
	if q.byOwner[key] -= n; q.byOwner[key] <= 0 {
		delete(q.byOwner, key)
	}
}

// guestRefusal turns a refusal of the guest agent client's buffer budget
// (qga.Budget, through the sandbox sentinels) into a quota refusal of the
// call's owner: counted, and answered with Retry-After. Other errors pass.
func (s *Server) guestRefusal(owner string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sandbox.ErrOwnerBusy):
		s.met.countRefusal(owner, "guest-buffer-bytes")
		return &retryError{p: newProblem(apitype.ProblemTooManyRequests, err.Error()), after: quotaRetry}
	case errors.Is(err, sandbox.ErrBusy):
		s.met.countRefusal(owner, "node-guest-buffer-bytes")
		return &retryError{p: newProblem(apitype.ProblemUnavailable, err.Error()), after: quotaRetry}
	}
	return err
}

// retryError is a refusal the client may retry after a while: wrap sends
// its problem with a Retry-After header.
type retryError struct {
	p     *apitype.Problem
	after time.Duration
}

func (e *retryError) Error() string { return e.p.Error() }

// Unwrap lets asProblem find the problem.
func (e *retryError) Unwrap() error { return e.p }

// setRetryAfter sets the Retry-After header of a retryError.
func setRetryAfter(h http.Header, err error) {
	var re *retryError
	if errors.As(err, &re) {
		h.Set("Retry-After", strconv.Itoa(int(re.after/time.Second)))
	}
}
