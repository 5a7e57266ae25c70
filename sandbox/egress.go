package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Egress applies sandboxes' egress policies in the host guard: the parts
// of the daemon's egress part the engine needs.
type Egress interface {
	// Validate checks a policy; the error names the bad entry.
	Validate(p apitype.EgressPolicy) error
	// Set puts p in force for the sandbox's zone and bridges; it returns
	// once the kernel enforces it. On error nothing changed.
	Set(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error
	// Remove drops the sandbox's policy (its zone is gone).
	Remove(ctx context.Context, sandbox, zone string) error
	// Status returns the policy in force and the recent denials.
	Status(sandbox, zone string) apitype.EgressStatus
}

// EgressClaimer is an Egress that keeps records of a sandbox's egress
// (denials, learned addresses, counter series) and so must hear of a
// pool claim: Claim is Set for a new instance of the sandbox (the pool
// member handed to its claimer), nothing recorded before it shown or
// counted for the claimer. The engine calls it at a claim when its
// Egress has it (the daemon's does), Set otherwise.
type EgressClaimer interface {
	Claim(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error
}

// EgressStarter is an Egress that must hear of a sandbox's first
// instance (a create, or a pool member's build): Start is Set for a zone
// whose bridges are new, before its VMs start, and the place to clear
// what a deleted sandbox left on the same addresses (the daemon's removes
// the conntrack entries from the bridges' prefixes). The engine calls it
// there when its Egress has it, Set otherwise; a policy change (SetEgress,
// the check's re-apply) is always a Set, and a claim an EgressClaimer's
// Claim. On error nothing changed.
type EgressStarter interface {
	Start(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error
}

// EgressNamer is an Egress whose resolver answers the names of a
// sandbox's VMs to that sandbox's own guests (the daemon's does), in
// every mode, as the managed block of their /etc/hosts does (names.go).
// The engine hands them over wherever it writes that block (a cold
// create before ready, a claim after the claim's EgressClaimer.Claim,
// which drops the member's) and again at a start (Reconcile: the
// daemon's resolver keeps them in memory only); they go with the
// sandbox's instance in the Egress (Remove, a claim).
type EgressNamer interface {
	// SetNames replaces the VM names of the sandbox's current instance:
	// each VM's name with its addresses. It refuses a zone whose policy
	// is not the sandbox's.
	SetNames(ctx context.Context, sandbox, zone string, names map[string][]NameAddr) error
}

// NameAddr is an address a VM's name resolves to: Addr on the guest
// bridge (vnet) Bridge.
type NameAddr struct {
	Bridge string
	Addr   netip.Addr
}

// EgressEntryRules are the rules an Egress's Validate applies to each
// allow and deny entry: regular expressions (RE2 and ECMA-262 alike)
// matching exactly the entries it takes of at most MaxChars characters,
// and at most MaxEntries entries in each list. An Egress that has them
// says them (an EntryRules method), and the API's document states them.
type EgressEntryRules struct {
	AllowPattern, DenyPattern string
	MaxChars, MaxEntries      int
}

// ValidateEgress checks an optional policy (nil passes) for a create or
// SetEgress: an InvalidError of field "egress" when egress policies are
// off on this node or the egress part rejects it.
func (m *Engine) ValidateEgress(p *apitype.EgressPolicy) error {
	if p == nil {
		return nil
	}
	if m.o.Egress == nil {
		return invalid("egress", "egress policies are not enabled on this node")
	}
	if err := m.o.Egress.Validate(*p); err != nil {
		return invalid("egress", "%v", err)
	}
	return nil
}

// EgressStatus returns sb's policy in force and its recent denials
// (ErrNotConfigured when egress policies are off on this node).
func (m *Engine) EgressStatus(sb apitype.Sandbox) (apitype.EgressStatus, error) {
	if m.o.Egress == nil {
		return apitype.EgressStatus{}, refuse(ErrNotConfigured, "egress policies are not enabled on this node")
	}
	st := m.o.Egress.Status(sb.ID, sb.Zone)
	if sb.State == apitype.StateCreating {
		// a pool member being claimed holds its pre-claim instance's
		// denials until the claim's policy is in force: not the
		// claimer's to read (nor a cold create's own yet)
		st.Denials = []apitype.EgressDenial{}
	}
	return st, nil
}

// SetEgress replaces a ready sandbox's policy; it is enforced in the kernel
// when the call returns. Check p with ValidateEgress first.
func (m *Engine) SetEgress(ctx context.Context, sb apitype.Sandbox, p apitype.EgressPolicy) (apitype.EgressStatus, error) {
	if err := m.ValidateEgress(&p); err != nil {
		return apitype.EgressStatus{}, err
	}
	if sb.State != apitype.StateReady {
		return apitype.EgressStatus{}, refuse(ErrConflict, "sandbox %s is %s", sb.ID, sb.State)
	}
	if sandboxUsesSharedVNets(sb) {
		return apitype.EgressStatus{}, errSharedEgress()
	}
	if err := m.o.Egress.Set(ctx, sb.ID, sb.Zone, sandboxBridges(sb), p); err != nil {
		return apitype.EgressStatus{}, fmt.Errorf("set egress policy of %s: %w", sb.ID, err)
	}
	return m.o.Egress.Status(sb.ID, sb.Zone), nil
}

// applyEgress puts a new sandbox's policy (open when none was asked for)
// in force before its VMs start (EgressStarter).
func (m *Engine) applyEgress(ctx context.Context, rec *record) error {
	return m.putEgress(ctx, rec, false)
}

// claimEgress puts a claimed pool member's policy in force as a new
// instance of its egress record (EgressClaimer): the member's denials and
// learned addresses are not the claimer's.
func (m *Engine) claimEgress(ctx context.Context, rec *record) error {
	return m.putEgress(ctx, rec, true)
}

func (m *Engine) putEgress(ctx context.Context, rec *record, claim bool) error {
	if m.o.Egress == nil {
		return nil
	}
	m.mu.Lock()
	p := apitype.EgressPolicy{Mode: "open"}
	if rec.egress != nil {
		p = *rec.egress
	}
	id, zone, bridges := rec.ID, rec.Zone, sandboxBridges(rec.Sandbox)
	m.mu.Unlock()
	set := m.o.Egress.Set
	if s, ok := m.o.Egress.(EgressStarter); ok && !claim {
		set = s.Start
	}
	if c, ok := m.o.Egress.(EgressClaimer); ok && claim {
		set = c.Claim
	}
	if err := set(ctx, id, zone, bridges, p); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	return nil
}

// removeEgress drops a deleted sandbox's policy; a failure is logged (the
// zone's bridges are gone, so the stale policy guards nothing).
func (m *Engine) removeEgress(ctx context.Context, id, zone string) {
	if m.o.Egress == nil {
		return
	}
	if err := m.o.Egress.Remove(ctx, id, zone); err != nil {
		m.log.Error("remove egress policy", "sandbox", id, "err", err)
	}
}

func sandboxBridges(sb apitype.Sandbox) []string {
	var out []string
	for _, n := range sb.Networks {
		out = append(out, n.VNet)
	}
	return out
}

// EgressLogFilter selects records of a sandbox's egress record.
type EgressLogFilter struct {
	// Type is "dns", "conn" or "flow" ("": all); VMID one VM's (0: all).
	Type string
	VMID int
	// Since and Limit page: the records after Seq Since, at most Limit.
	Since uint64
	Limit int
}

// EgressRecorder is an Egress that keeps the sandboxes' egress record
// (the daemon's does): the DNS questions, connections and kernel flows
// of a sandbox's guests, VM by VMID (the engine names them).
type EgressRecorder interface {
	Log(sandbox string, f EgressLogFilter) apitype.EgressLog
}

// MaxEgressLogLimit is the most records one read of the egress record
// returns; DefaultEgressLogLimit when the query says none.
const (
	MaxEgressLogLimit     = 2000
	DefaultEgressLogLimit = 1000
)

// EgressLog returns a page of sb's egress record (ErrNotConfigured when
// this node keeps none). q.VM must name a VM of sb.
func (m *Engine) EgressLog(sb apitype.Sandbox, q apitype.EgressLogQuery) (apitype.EgressLog, error) {
	rec, ok := m.o.Egress.(EgressRecorder)
	if !ok {
		return apitype.EgressLog{}, refuse(ErrNotConfigured, "this node keeps no egress record")
	}
	f := EgressLogFilter{Type: q.Type, Since: q.Since, Limit: q.Limit}
	if f.Limit == 0 {
		f.Limit = DefaultEgressLogLimit
	}
	switch {
	case q.Type != "" && q.Type != "dns" && q.Type != "conn" && q.Type != "flow":
		return apitype.EgressLog{}, invalid("type", "type %q: want dns, conn or flow", q.Type)
	case f.Limit < 1 || f.Limit > MaxEgressLogLimit:
		return apitype.EgressLog{}, invalid("limit", "limit %d: want 1..%d", q.Limit, MaxEgressLogLimit)
	}
	for _, v := range sb.VMs {
		if q.VM != "" && v.Name == q.VM {
			f.VMID = v.VMID
		}
	}
	if q.VM != "" && f.VMID == 0 {
		return apitype.EgressLog{}, invalid("vm", "sandbox %s has no VM %q", sb.ID, q.VM)
	}
	if sb.State == apitype.StateCreating {
		// a pool member being claimed holds its pre-claim instance's
		// record until the claim's policy is in force (which forgets
		// it): not the claimer's to read; a cold create's own records
		// show once it is ready
		return apitype.EgressLog{Sandbox: sb.ID, Records: []apitype.EgressRecord{}}, nil
	}
	out := rec.Log(sb.ID, f)
	names := vmNames(sb.VMs)
	for i := range out.Records {
		out.Records[i].VM = names[out.Records[i].VMID]
	}
	return out, nil
}

// vmNames maps the VMIDs of vms to their names (the egress record names
// its VMs by VMID only).
func vmNames(vms []apitype.VM) map[int]string {
	names := make(map[int]string, len(vms))
	for _, v := range vms {
		names[v.VMID] = v.Name
	}
	return names
}

// EgressHandover is a deleted sandbox's whole egress record, taken out of
// the node's record where its delete would have dropped it
// (EgressTaker.TakeLog): every record its ring still held, oldest first,
// and the count of those the bounds dropped. Its records stay counted in
// the node's bound until Release.
type EgressHandover interface {
	// Len is the records held; Dropped counts those dropped by the
	// bounds; Next is the newest held record's seq (0: none).
	Len() int
	Dropped() uint64
	Next() uint64
	// Each calls fn with each record, oldest first, and stops at the
	// first error fn returns, which it returns.
	Each(fn func(apitype.EgressRecord) error) error
	// Release lets the records go; call it once they are written out.
	Release()
}

// EgressTaker is an EgressRecorder that can hand a sandbox's whole record
// over at its delete instead of dropping it (the daemon's does).
type EgressTaker interface {
	EgressRecorder
	// TakeLog ends the sandbox's record where Remove would drop it and
	// returns what it held, never nil (empty when it held nothing); what
	// of its egress was still open (a connection, a flow: recorded only
	// at their end) is ended and recorded first.
	TakeLog(sandbox string) EgressHandover
}

// egressKeep is a delete that keeps the sandbox's egress record: taken
// from the Egress after the teardown and its last egress event, its VMs
// named.
type egressKeep struct {
	from EgressTaker
	got  EgressHandover // set once taken
}

// takeEgress takes rec's egress record into k.
func (m *Engine) takeEgress(k *egressKeep, rec *record) {
	m.mu.Lock()
	id, names := rec.ID, vmNames(rec.VMs)
	m.mu.Unlock()
	k.got = namedHandover{EgressHandover: k.from.TakeLog(id), names: names}
}

// namedHandover is an EgressHandover whose records name their VMs.
type namedHandover struct {
	EgressHandover
	names map[int]string
}

// Each implements EgressHandover.
func (n namedHandover) Each(fn func(apitype.EgressRecord) error) error {
	return n.EgressHandover.Each(func(r apitype.EgressRecord) error {
		r.VM = n.names[r.VMID]
		return fn(r)
	})
}

// DeleteKeepingEgress is DeleteBy handing over the sandbox's whole egress
// record instead of dropping it: taken once its VMs are gone and its last
// egress event is published, so it holds every record made until then.
// Nothing is deleted when this node keeps no egress record
// (ErrNotConfigured), or when the sandbox is being created (ErrConflict:
// its record reads empty until it is ready). A sandbox already gone, or whose delete by another
// caller (or the reaper) ended first, is ErrUnknown: its record went with
// that delete. Release the answer once it is written.
func (m *Engine) DeleteKeepingEgress(ctx context.Context, id, by string) (EgressHandover, error) {
	t, ok := m.o.Egress.(EgressTaker)
	if !ok {
		return nil, refuse(ErrNotConfigured, "this node keeps no egress record: sandbox %s not deleted", id)
	}
	keep := &egressKeep{from: t}
	if err := m.deleteBy(ctx, id, by, keep); err != nil {
		return nil, err // failed before the record was taken: it stays
	}
	if keep.got == nil {
		return nil, refuse(ErrUnknown, "sandbox %s is gone: no egress record to hand over (it went with the sandbox's delete)", id)
	}
	return keep.got, nil
}
