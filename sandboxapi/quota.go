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
// The rule keeps one invariant. Let seats = node / share (whole shares;
// four with the defaults) and A the owners holding some of the resource.
// After every take,
//
//	node - used >= sum over holders of (share - min(held, share)) + (seats - A) x share
//
// while A < seats: every owner holding some can still fill its share, and
// every owner arriving finds its whole share, until seats owners hold
// some. A fifth owner is thus refused only while four others hold some (a
// quarter each at most). It follows that an owner takes past its share
// only from the part of the node total that is not whole shares (node mod
// share: none with the defaults), and only for a quota that lets it
// borrow (the collected bytes; never the slots, a slot may be held for a
// day). The collected bytes are held for as long as their exec runs (up
// to 24 h), so a borrowed share could not be handed back to an owner who
// arrives later: there is no borrowing from the shares themselves, and no
// "first call" exemption either. A take that keeps the invariant is never
// refused; one within the owner's share never is while A < seats. A take
// past the share is refused with 429 too-many-requests and Retry-After
// (the owner's own load), past the node total with 503 unavailable and
// Retry-After (only reached when seats owners hold some, or when the node
// total is not a multiple of the share). A single call larger than the
// share plus the borrowable remainder could never be taken: it is refused
// for good with 400 invalid-request naming the share (a collected exec
// with output_limit over 32 MiB at the defaults must stream).

// quota is one resource's node total and per-owner share.
type quota struct {
	name        string // metric label: exec-slots, file-slots, collected-bytes
	node, share int64
	// borrow lets owners past their share within node mod share, the part
	// of the node total that is not whole shares.
	borrow bool
	unit   string // what one is: "calls", "bytes"
	met    *metrics

	mu   sync.Mutex
	used int64
	// excess is what the owners hold past their shares together: at most
	// q.spare().
	excess  int64
	byOwner map[string]int64
}

func newQuota(name, unit string, node, share int64, borrow bool, met *metrics) *quota {
	return &quota{name: name, unit: unit, node: node, share: share, borrow: borrow, met: met, byOwner: map[string]int64{}}
}

// spare is what the owners may hold past their shares together: the part
// of the node total that is not whole shares, for a borrowing quota.
func (q *quota) spare() int64 {
	if !q.borrow || q.share <= 0 {
		return 0
	}
	return q.node % q.share
}

// over is what holding held is past the share.
func (q *quota) over(held int64) int64 { return max(0, held-q.share) }

// quotaRetry is the Retry-After of a quota refusal.
const quotaRetry = 5 * time.Second

// take takes n of the resource for owner, or refuses at once: 400 when n
// could never be taken, 429 when the owner's share is used up, 503 when
// the node total is. Every refusal is counted. release gives n back.
func (q *quota) take(owner string, n int64) (release func(), err error) {
	key := ownerLabel(owner)
	q.mu.Lock()
	held := q.byOwner[key]
	excess := q.excess - q.over(held) + q.over(held+n)
	switch {
	case n > q.share+q.spare():
		q.mu.Unlock()
		q.met.countRefusal(owner, q.name)
		p := problemf(apitype.ProblemInvalidRequest,
			"the call asks %d %s (%s), more than an owner's share of %d can ever give; ask for less", n, q.unit, q.name, q.share+q.spare())
		return nil, p
	case excess > q.spare():
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
	q.excess = excess
	q.byOwner[key] = held + n
	q.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { q.give(key, n) }) }, nil
}

func (q *quota) give(key string, n int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	held := q.byOwner[key]
	q.used -= n
	q.excess += q.over(held-n) - q.over(held)
	if q.byOwner[key] = held - n; q.byOwner[key] <= 0 {
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
