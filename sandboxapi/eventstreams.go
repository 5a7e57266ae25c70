package sandboxapi

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// StreamLimits cap the GET /v1/events streams open at once ([api.events])
// and bound their writes. A stream past a cap is refused with 429
// too-many-requests and a Retry-After, and counted in
// pve_inspect_api_quota_refusals_total{quota="event-streams"}. Zero
// values take the defaults.
type StreamLimits struct {
	// PerToken caps one token's streams (8); every caller of the local
	// socket is one token of its own (no token, whatever its name, shares
	// its count).
	PerToken int
	// PerOwner caps the streams of every token bound to one owner
	// together (16); a token bound to no owner is an owner of its own, and
	// so is the local socket (streamKeys).
	PerOwner int
	// Node caps every stream of the node together (256: sixteen owners at
	// their share).
	Node int
	// WriteTimeout bounds each write of a stream (a batch of events or a
	// keepalive; 30s): a client that does not take it in time is cut off
	// and its slot freed; it resumes with Last-Event-ID (a gap event when
	// it fell out of the buffer). Publishing never waits for a stream.
	// It bounds the guest I/O calls' client too (clientio.go): each write
	// of an exec's answer (streamed or collected) and of a file download,
	// and each read of a file upload's body.
	WriteTimeout time.Duration
}

// Default stream caps: a stream costs a goroutine, a wake-up per event and
// the copy of the events it has not seen, so the node's total is sized
// for sixteen owners at their share rather than for the machine's limits.
const (
	defaultStreamsPerToken = 8
	defaultStreamsPerOwner = 16
	defaultStreamsNode     = 256
	// streamRetryAfter is the Retry-After of a refused stream, seconds.
	streamRetryAfter = 10
)

func (c *StreamLimits) defaults() error {
	if c.PerToken < 0 || c.PerOwner < 0 || c.Node < 0 || c.WriteTimeout < 0 {
		return errors.New("sandboxapi: the event stream limits must not be negative")
	}
	if c.PerToken == 0 {
		c.PerToken = defaultStreamsPerToken
	}
	if c.PerOwner == 0 {
		c.PerOwner = defaultStreamsPerOwner
	}
	if c.Node == 0 {
		c.Node = defaultStreamsNode
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 30 * time.Second
	}
	return nil
}

// streamCount counts the open streams by token, owner and node.
type streamCount struct {
	caps StreamLimits

	// The mutex protects the following elements; a leaf, held for the
	// counts only.
	mu      sync.Mutex
	node    int
	owner   map[string]int
	byToken map[string]int
}

func newStreamCount(c StreamLimits) *streamCount {
	return &streamCount{caps: c, owner: map[string]int{}, byToken: map[string]int{}}
}

// take counts one more stream of p, or says which cap is full (a
// too-many-requests problem). release gives the stream back.
func (s *streamCount) take(p principal) (release func(), _ *apitype.Problem) {
	owner, token := streamKeys(p)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.refusalLocked(owner, token); p != nil {
		p.Quota = streamsQuota
		return nil, p
	}
	s.node++
	s.owner[owner]++
	s.byToken[token]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.node--
		if s.owner[owner]--; s.owner[owner] == 0 {
			delete(s.owner, owner)
		}
		if s.byToken[token]--; s.byToken[token] == 0 {
			delete(s.byToken, token)
		}
	}, nil
}

// localStreamKey is the local socket's key in the stream counts, by token and
// by owner: no token name or owner (auth.ValidName: [A-Za-z0-9._-]) can
// equal it.
const localStreamKey = "(local)"

// streamKeys are the keys p's streams are counted under: by owner, the
// owner of a bound token, "token:<name>" for a token bound to none (each
// its own owner: two unbound tokens cannot fill one shared share) and
// localStreamKey for the local socket; by token, the token's name, or
// localStreamKey. A ':' or '(' is in no token name or owner, so no key of
// one kind equals another's.
func streamKeys(p principal) (owner, token string) {
	switch {
	case p.local:
		return localStreamKey, localStreamKey
	case p.owner != "":
		return p.owner, p.name
	}
	return "token:" + p.name, p.name
}

// openStream takes a stream slot for p, or sets Retry-After on w, counts
// the refusal and returns the problem.
func (s *Server) openStream(w http.ResponseWriter, p principal) (func(), error) {
	release, prob := s.streams.take(p)
	if prob != nil {
		w.Header().Set("Retry-After", strconv.Itoa(streamRetryAfter))
		s.met.quotaRefusals.WithLabelValues(ownerLabel(p.owner), streamsQuota).Inc()
		return nil, prob
	}
	return release, nil
}

// streamsQuota names the event streams' caps in refusals and their count.
const streamsQuota = "event-streams"

// refusalLocked says which cap a new stream of owner and token would pass,
// or nil.
func (s *streamCount) refusalLocked(owner, token string) *apitype.Problem {
	switch {
	case s.byToken[token] >= s.caps.PerToken:
		return problemf(apitype.ProblemTooManyRequests,
			"token %q has %d event streams open, the most one token may ([api.events] max_streams_per_token); close one or retry later", token, s.caps.PerToken)
	case s.owner[owner] >= s.caps.PerOwner:
		return problemf(apitype.ProblemTooManyRequests,
			"owner %q has %d event streams open, the most one owner may ([api.events] max_streams_per_owner); close one or retry later", owner, s.caps.PerOwner)
	case s.node >= s.caps.Node:
		return problemf(apitype.ProblemTooManyRequests,
			"this node has %d event streams open, the most it serves ([api.events] max_streams); retry later", s.caps.Node)
	}
	return nil
}
