package sandboxapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// The query parameters of GET .../egress/log.
var (
	pLogType = param{name: "type", in: "query", desc: "only records of this type", schema: func() map[string]any {
		return map[string]any{"type": "string", "enum": []string{"dns", "conn", "flow"}}
	}}
	pLogVM    = param{name: "vm", in: "query", desc: "only records of this VM of the sandbox (its name)"}
	pLogSince = param{name: "since", in: "query", desc: "only records after this seq (a page's next)", schema: func() map[string]any {
		return map[string]any{"type": "integer", "format": "int64", "minimum": 0}
	}}
	pLogLimit = param{name: "limit", in: "query", desc: "the most records returned (default 1000)", schema: func() map[string]any {
		return map[string]any{"type": "integer", "minimum": 1, "maximum": sandbox.MaxEgressLogLimit}
	}}
)

// An egress record read holds its page (up to sandbox.MaxEgressLogLimit
// records, about 1.7 KiB each while answered) until the client has read
// it, and scans the record under the log's lock: at most maxLogReads run
// on the node, ownerLogReads for one owner (a row of the README's
// worst-case memory table).
const (
	maxLogReads   = 8
	ownerLogReads = 2
)

// getEgressLog answers a page of the sandbox's egress record: JSON
// (EgressLog), or with Accept: application/x-ndjson one EgressRecord per
// line, the page's dropped, next and more in X-Egress-Dropped,
// X-Egress-Next and X-Egress-More.
func (s *Server) getEgressLog(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.lookup(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	q := apitype.EgressLogQuery{Type: r.URL.Query().Get("type"), VM: r.URL.Query().Get("vm")}
	if v := r.URL.Query().Get("since"); v != "" {
		// an int64 as the document says (schemathesis ST201: 2^63 was
		// taken), never negative
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return invalid("since", "since %q: want a record's seq (a non-negative 64-bit integer)", v)
		}
		q.Since = uint64(n)
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return invalid("limit", "limit %q: want 1..%d", v, sandbox.MaxEgressLogLimit)
		}
		q.Limit = n
	}
	release, err := s.logReads.take(sb.Owner, 1)
	if err != nil {
		return err
	}
	defer release()
	page, err := s.e.EgressLog(sb, q)
	if err != nil {
		return err
	}
	if !wantsNDJSON(r) {
		return writeJSON(w, http.StatusOK, page)
	}
	writeEgressNDJSON(w, page, func(fn func(apitype.EgressRecord) error) error {
		for _, rec := range page.Records {
			if err := fn(rec); err != nil {
				return err
			}
		}
		return nil
	})
	return nil
}

// writeEgressNDJSON answers 200 with one EgressRecord a line, each as
// each yields it, and the page's dropped, next and more (head's; its
// Records unused) in X-Egress-Dropped, X-Egress-Next and X-Egress-More.
func writeEgressNDJSON(w http.ResponseWriter, head apitype.EgressLog, each func(func(apitype.EgressRecord) error) error) {
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Egress-Dropped", strconv.FormatUint(head.Dropped, 10))
	h.Set("X-Egress-Next", strconv.FormatUint(head.Next, 10))
	h.Set("X-Egress-More", strconv.FormatBool(head.More))
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	_ = each(func(rec apitype.EgressRecord) error { return enc.Encode(rec) }) // an error: the client went away, the status is sent
}

// pDeleteEgressLog is the query parameter of DELETE /v1/sandboxes/{id}
// that asks for the sandbox's egress record in the answer.
var pDeleteEgressLog = param{name: "egress_log", in: "query",
	desc:   "true: delete the sandbox and answer 200 with its whole egress record as it stood once its VMs were gone (EgressLog; EgressRecord lines with Accept: application/x-ndjson); false or absent: 204",
	schema: func() map[string]any { return map[string]any{"type": "boolean"} }}

// egressLogParam reads the egress_log parameter of a delete: absent is
// false; anything but true or false, or the parameter given twice, is
// refused, before anything is deleted.
func egressLogParam(r *http.Request) (bool, error) {
	q := r.URL.Query()
	if !q.Has(pDeleteEgressLog.name) {
		return false, nil
	}
	if vs := q[pDeleteEgressLog.name]; len(vs) > 1 {
		return false, invalid(pDeleteEgressLog.name, "egress_log given %d times (%q): give it once, true or false (nothing was deleted)", len(vs), vs)
	}
	switch v := q.Get(pDeleteEgressLog.name); v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	default:
		return false, invalid(pDeleteEgressLog.name, "egress_log %q: want true or false (nothing was deleted)", v)
	}
}

// deleteKeepingEgress deletes a sandbox and answers its whole egress
// record (egress_log=true). It is written from the ring the engine took,
// record by record, never as one buffer: the hand-over holds only the
// owner's own ring, already counted in the node's bound of records, so it
// takes none of the egress record reads (which bound the pages copied
// out of rings) and an eval's many cleanups run at once. A sandbox not found
// (gone, or another owner's) is not-found: its record went with it.
func (s *Server) deleteKeepingEgress(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.lookup(p, r.PathValue("id"))
	if err != nil {
		return problemf(apitype.ProblemNotFound, "sandbox %q not found: no egress record to hand over (nothing was deleted)", r.PathValue("id"))
	}
	h, err := s.e.DeleteKeepingEgress(r.Context(), sb.ID, p.who())
	if err != nil {
		return err
	}
	defer h.Release()
	s.boundHandover(w, h.Len())
	head := apitype.EgressLog{Sandbox: sb.ID, Dropped: h.Dropped(), Next: h.Next()}
	if wantsNDJSON(r) {
		writeEgressNDJSON(w, head, h.Each)
		return nil
	}
	return writeEgressJSON(w, head, h.Each)
}

// handoverRecordsPerTimeout is how many records of a hand-over each
// Streams.WriteTimeout covers: about 1.5 MiB of JSON at most (a record
// is under 1.5 KiB as answered).
const handoverRecordsPerTimeout = 1024

// boundHandover bounds the writing of a hand-over of n records: the
// whole answer within Streams.WriteTimeout per handoverRecordsPerTimeout
// records started, from now (the teardown is done). Its records stay
// counted in the node's bound of egress records until written, so a
// client that stops reading, or reads a byte at a time, must not hold
// them for the route's deadline (the teardown's and the SDN apply's:
// half an hour by default) while its owner deletes and creates
// sandboxes again, each hand-over's room on top of its live sandboxes'
// until other sandboxes' new records are dropped at the node's bound.
// Past it the connection is cut, the records let go.
func (s *Server) boundHandover(w http.ResponseWriter, n int) {
	d := s.o.Streams.WriteTimeout * time.Duration(1+n/handoverRecordsPerTimeout)
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.o.Logger.Warn("set the egress hand-over's write deadline", "err", err)
	}
}

// writeEgressJSON answers 200 with an EgressLog: head's fields, then its
// records as each yields them, written one by one. A client that goes
// away is not an error (the status is sent).
func writeEgressJSON(w http.ResponseWriter, head apitype.EgressLog, each func(func(apitype.EgressRecord) error) error) error {
	head.Records = []apitype.EgressRecord{}
	b, err := json.Marshal(head)
	if err != nil {
		return fmt.Errorf("egress record answer: %w", err)
	}
	// {"sandbox":...,"records":[],...}: the records go between the brackets
	open, rest, _ := bytes.Cut(b, []byte(`"records":[]`))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(append(open, `"records":[`...)); err != nil {
		return nil
	}
	enc := json.NewEncoder(w)
	first := true
	err = each(func(rec apitype.EgressRecord) error {
		if !first {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		first = false
		return enc.Encode(rec)
	})
	if err == nil {
		_, _ = w.Write(append(append([]byte("]"), rest...), '\n'))
	}
	return nil
}

func (s *Server) getEgress(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.lookup(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	st, err := s.e.EgressStatus(sb)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, st)
}

// putEgress replaces a running sandbox's policy; it is enforced in the
// kernel when the call returns.
func (s *Server) putEgress(w http.ResponseWriter, r *http.Request, pr0 principal) error {
	sb, err := s.lookup(pr0, r.PathValue("id"))
	if err != nil {
		return err
	}
	var p apitype.EgressPolicy
	if pr := decodeJSON(w, r, maxJSONBody, &p); pr != nil {
		return pr
	}
	st, err := s.e.SetEgress(r.Context(), sb, p)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, st)
}
