package sandboxapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// eventsTimeout bounds one event stream; a client reconnects with
// Last-Event-ID and misses nothing the buffer still holds.
func eventsTimeout(*Server) time.Duration { return time.Hour }

// eventsKeepalive is how often an idle stream gets a comment line, so
// proxies and clients see it alive.
const eventsKeepalive = 15 * time.Second

var (
	pSandboxFilter = param{name: "sandbox", in: "query", schema: filterSchema(nil),
		desc: fmt.Sprintf("only events of these sandbox ids (comma-separated or repeated; at most %d, more is invalid-request)", maxFilterItems)}
	pTypeFilter = param{name: "type", in: "query", schema: filterSchema(apitype.EventTypes()),
		desc: fmt.Sprintf("only events of these types (comma-separated or repeated; at most %d): %s", maxFilterItems, strings.Join(apitype.EventTypes(), ", "))}
	pLastEvent = param{name: "last_event_id", in: "query", desc: "resume after this event id (the Last-Event-ID header wins)"}
)

// filterSchema is the schema of a filter list: at most maxFilterItems
// strings, of enum when it is set.
func filterSchema(enum []string) func() map[string]any {
	return func() map[string]any {
		items := map[string]any{"type": "string"}
		if enum != nil {
			items["enum"] = enum
		}
		return map[string]any{"type": "array", "items": items, "maxItems": maxFilterItems}
	}
}

// eventsRoute is GET /v1/events (added to the route table in handlers.go).
func (s *Server) eventsRoute() route {
	return route{method: "GET", path: "/v1/events", scope: apitype.ScopeRead,
		summary: "Server-sent events of the caller's sandboxes (created, ready, health, egress-denied, egress, expiring-soon, expired, deleted); resumable with Last-Event-ID. egress events carry what the sandbox's egress record counted since its previous one (EgressCounts), at most one per sandbox per second and held apart from the owner's other events, so a flood of traffic neither floods the stream nor evicts them. " +
			"Streams are capped per token, per owner and per node: one past a cap is refused with 429 too-many-requests and Retry-After",
		responseType: "text/event-stream", okStatus: 200, params: []param{pSandboxFilter, pTypeFilter, pLastEvent},
		timeout: eventsTimeout, h: s.eventStream}
}

// maxFilterItems bounds each of the stream's filter lists (sandbox, type):
// a filter is held as a set, and a longer list is refused.
const maxFilterItems = 256

// listParam splits a repeated or comma-separated query parameter; more
// than maxFilterItems items is an invalid request naming the bound.
func listParam(r *http.Request, name string) ([]string, error) {
	var out []string
	for _, v := range r.URL.Query()[name] {
		for v != "" {
			var x string
			x, v, _ = strings.Cut(v, ",")
			if x = strings.TrimSpace(x); x == "" {
				continue
			}
			if len(out) == maxFilterItems {
				return nil, invalid(name, "more than %d %s filters; follow at most %d per stream (open another stream, or none: all the caller may see)", maxFilterItems, name, maxFilterItems)
			}
			out = append(out, x)
		}
	}
	return out, nil
}

// eventFilter reads the stream's filter and resume point (resume: one was
// given).
func eventFilter(r *http.Request, p principal) (f sandbox.EventFilter, last uint64, resume bool, err error) {
	ids, err := listParam(r, "sandbox")
	if err != nil {
		return f, 0, false, err
	}
	types, err := listParam(r, "type")
	if err != nil {
		return f, 0, false, err
	}
	for _, id := range ids {
		if !sandbox.ValidID(id) {
			return f, 0, false, invalid("sandbox", "%q is not a sandbox id", id)
		}
	}
	for _, t := range types {
		if !slices.Contains(apitype.EventTypes(), t) {
			return f, 0, false, invalid("type", "unknown event type %q (one of %s)", t, strings.Join(apitype.EventTypes(), ", "))
		}
	}
	f = sandbox.NewEventFilter(p.owner, ids, types)
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return f, 0, false, nil
	}
	n, perr := strconv.ParseUint(v, 10, 64)
	if perr != nil {
		return f, 0, false, invalid("last_event_id", "Last-Event-ID %q is not an event id", v)
	}
	return f, n, true, nil
}

// eventStream serves GET /v1/events: replays the buffered events after
// Last-Event-ID (after a gap event when some were lost), then sends each
// new one as it comes, until the client goes or the route's deadline.
// Without Last-Event-ID the stream starts with the next event.
func (s *Server) eventStream(w http.ResponseWriter, r *http.Request, p principal) error {
	f, last, resume, err := eventFilter(r, p)
	if err != nil {
		return err
	}
	release, err := s.openStream(w, p)
	if err != nil {
		return err
	}
	defer release()
	if !resume {
		last = s.e.LastEventID()
	}
	rc := http.NewResponseController(w)
	// The request has no body: lift the read deadline, which would
	// otherwise cancel the stream's context when it passes (net/http's
	// background read of an idle connection).
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	writing := func() { _ = rc.SetWriteDeadline(time.Now().Add(s.o.Streams.WriteTimeout)) }
	writing()
	if _, err := fmt.Fprintf(w, ": events of node %s\n\n", s.e.Node()); err != nil {
		return nil
	}
	_ = rc.Flush()
	ctx := r.Context()
	tick := time.NewTicker(eventsKeepalive)
	defer tick.Stop()
	for {
		b := s.e.EventsSince(last, f)
		writing()
		if b.Lost {
			gap := apitype.Event{Type: apitype.EventGap, Time: time.Now().UTC(),
				Detail: fmt.Sprintf("events after id %d left the daemon's buffer or are from before a restart; re-read the sandboxes followed", last)}
			if err := writeSSE(w, gap); err != nil {
				return nil
			}
		}
		for _, e := range b.Events {
			if err := writeSSE(w, e); err != nil {
				return nil
			}
		}
		last = b.Upto
		_ = rc.Flush()
		select {
		case <-ctx.Done():
			return nil
		case <-b.Changed:
		case <-tick.C:
			writing()
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return nil
			}
			_ = rc.Flush()
		}
	}
}

// writeSSE writes one event; an event without an id (gap) has no id
// field, so it does not move the client's Last-Event-ID.
func writeSSE(w http.ResponseWriter, e apitype.Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if e.ID != 0 {
		if _, err := fmt.Fprintf(w, "id: %d\n", e.ID); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Type, b)
	return err
}
