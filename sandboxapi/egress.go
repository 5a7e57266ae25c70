package sandboxapi

import (
	"encoding/json"
	"net/http"
	"strconv"

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
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Egress-Dropped", strconv.FormatUint(page.Dropped, 10))
	h.Set("X-Egress-Next", strconv.FormatUint(page.Next, 10))
	h.Set("X-Egress-More", strconv.FormatBool(page.More))
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for _, rec := range page.Records {
		if err := enc.Encode(rec); err != nil {
			return nil // the client went away; the status is sent
		}
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
