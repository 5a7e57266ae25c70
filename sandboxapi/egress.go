package sandboxapi

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// EgressPolicy is a sandbox's egress policy (DESIGN.md section 10).
type EgressPolicy struct {
	// Mode is "open" (default), "allowlist" or "none".
	Mode string `json:"mode"`
	// Allow lists exact domains, wildcard domains ("*.example.org"),
	// IPv4 addresses and CIDRs; allowlist mode only.
	Allow []string `json:"allow,omitempty"`
	// Deny lists IPv4 addresses and CIDRs never reachable, in any mode.
	Deny []string `json:"deny,omitempty"`
}

// EgressDenial is one refused name or connection.
type EgressDenial struct {
	Time time.Time `json:"time"`
	// Reason is name, mode, sni, host, peek or address.
	Reason string `json:"reason"`
	// Name is the refused DNS name, Host or SNI, when there is one.
	Name string `json:"name,omitempty"`
	// Dest is the destination: address:port for a refused connection, the
	// address alone for reason address (a kernel drop, counted per packet).
	Dest string `json:"dest,omitempty"`
}

// EgressStatus is a sandbox's policy in force and its recent denials.
type EgressStatus struct {
	Sandbox string         `json:"sandbox"`
	Policy  EgressPolicy   `json:"policy"`
	Denials []EgressDenial `json:"denials"`
}

// Egress applies sandboxes' egress policies in the host guard (the
// daemon's egress part implements it).
type Egress interface {
	// Validate checks a policy; the error names the bad entry.
	Validate(p EgressPolicy) error
	// Set puts p in force for the sandbox's zone and bridges; it returns
	// once the kernel enforces it. On error nothing changed.
	Set(ctx context.Context, sandbox, zone string, bridges []string, p EgressPolicy) error
	// Remove drops the sandbox's policy (its zone is gone).
	Remove(ctx context.Context, sandbox, zone string) error
	// Status returns the policy in force and the recent denials.
	Status(sandbox, zone string) EgressStatus
}

// validateEgress checks an optional create-time policy.
func (s *Server) validateEgress(p *EgressPolicy) *Problem {
	if p == nil {
		return nil
	}
	if s.o.Egress == nil {
		return invalid("egress", "egress policies are not enabled on this node")
	}
	if err := s.o.Egress.Validate(*p); err != nil {
		return invalid("egress", "%v", err)
	}
	return nil
}

// applyEgress puts a new sandbox's policy (open when none was asked for)
// in force before its VMs start.
func (m *manager) applyEgress(ctx context.Context, rec *record) error {
	if m.o.Egress == nil {
		return nil
	}
	m.mu.Lock()
	p := EgressPolicy{Mode: "open"}
	if rec.egress != nil {
		p = *rec.egress
	}
	id, zone, bridges := rec.ID, rec.Zone, sandboxBridges(rec.Sandbox)
	m.mu.Unlock()
	if err := m.o.Egress.Set(ctx, id, zone, bridges, p); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	return nil
}

// removeEgress drops a deleted sandbox's policy; a failure is logged (the
// zone's bridges are gone, so the stale policy guards nothing).
func (m *manager) removeEgress(ctx context.Context, id, zone string) {
	if m.o.Egress == nil {
		return
	}
	if err := m.o.Egress.Remove(ctx, id, zone); err != nil {
		m.log.Error("remove egress policy", "sandbox", id, "err", err)
	}
}

func sandboxBridges(sb Sandbox) []string {
	var out []string
	for _, n := range sb.Networks {
		out = append(out, n.VNet)
	}
	return out
}

func (s *Server) getEgress(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.lookup(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if s.o.Egress == nil {
		return problemf(ProblemUnavailable, "egress policies are not enabled on this node")
	}
	return writeJSON(w, http.StatusOK, s.o.Egress.Status(sb.ID, sb.Zone))
}

// putEgress replaces a running sandbox's policy; it is enforced in the
// kernel when the call returns.
func (s *Server) putEgress(w http.ResponseWriter, r *http.Request, pr0 principal) error {
	sb, err := s.lookup(pr0, r.PathValue("id"))
	if err != nil {
		return err
	}
	var p EgressPolicy
	if pr := decodeJSON(w, r, maxJSONBody, &p); pr != nil {
		return pr
	}
	if pr := s.validateEgress(&p); pr != nil {
		return pr
	}
	if sb.State != StateReady {
		return problemf(ProblemConflict, "sandbox %s is %s", sb.ID, sb.State)
	}
	if err := s.o.Egress.Set(r.Context(), sb.ID, sb.Zone, sandboxBridges(sb), p); err != nil {
		return fmt.Errorf("set egress policy of %s: %w", sb.ID, err)
	}
	return writeJSON(w, http.StatusOK, s.o.Egress.Status(sb.ID, sb.Zone))
}
