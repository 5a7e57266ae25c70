package sandboxapi

import (
	"net/http"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

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
