package containment

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// Status is a row's judgement.
type Status string

// Row statuses.
const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	// Unproven: blocked as expected, but a positive control failed, so a
	// dead network explains the silence as well as the guard does.
	Unproven Status = "UNPROVEN"
)

// Row is one judged check.
type Row struct {
	Group    Group   `json:"group"`
	Name     string  `json:"name"`
	Target   string  `json:"target"` // what was tried, e.g. "http PUT 169.254.169.254:80/latest/api/token"
	Expect   Verdict `json:"expect"`
	Observed Verdict `json:"observed"`
	Status   Status  `json:"status"`
	Control  bool    `json:"control,omitempty"`
	// Detail is what the network answered, e.g. "refused (RST): a route
	// exists", "HTTP 200", "NOERROR, 0 answers", "timeout after 3s".
	Detail string `json:"detail"`
	// Why says what a row that did not pass means for the sandbox ("" when
	// it passed).
	Why string `json:"why,omitempty"`
	// Outcome is the probe's raw outcome ("" for the lease row).
	Outcome   probe.Outcome `json:"outcome,omitempty"`
	ElapsedMS int           `json:"elapsed_ms"`

	kind  probe.Kind       // the probe target's kind ("" for the lease row)
	idmap []probe.IDExtent // the id map row's maps as the probe reported them
}

// Result is the judged containment check of one VM.
type Result struct {
	Policy string `json:"policy"`
	// Pass is Passed() at evaluation time, for JSON readers.
	Pass bool `json:"passed"`
	// ControlsOK is false when any positive control failed.
	ControlsOK bool        `json:"controls_ok"`
	Rows       []Row       `json:"rows"`
	Facts      probe.Facts `json:"facts"`
	// Sampling, when set, says which planned rows this run left out
	// (sample.go): they are in no row, passed or failed.
	Sampling *Sampling `json:"sampling,omitempty"`
}

// Passed reports whether every row passed (controls included).
func (r *Result) Passed() bool {
	if r == nil || len(r.Rows) == 0 {
		return false
	}
	for _, row := range r.Rows {
		if row.Status != Pass {
			return false
		}
	}
	return true
}

// Failed returns the rows that did not pass.
func (r *Result) Failed() []Row {
	var out []Row
	for _, row := range r.Rows {
		if row.Status != Pass {
			out = append(out, row)
		}
	}
	return out
}

// Evaluate judges a parsed probe report against the plan. Results whose id
// the plan does not know are ignored by this function; Runner.Run rejects
// such reports before they get here.
func Evaluate(p *Plan, rep *probe.Report) *Result {
	return evaluate(p, rep, nil)
}

// evaluate is Evaluate with what the node saw of the layer-2 rows' frames
// (nil: nothing was watched).
func evaluate(p *Plan, rep *probe.Report, l2 *layer2Seen) *Result {
	byID := make(map[string]probe.Result, len(rep.Results))
	for _, r := range rep.Results {
		byID[r.ID] = r
	}
	res := &Result{Policy: p.Policy, Facts: rep.Facts, ControlsOK: true, Sampling: p.Sampling}
	res.Rows = append(res.Rows, leaseRow(p.Lease, rep.Facts))
	for _, c := range p.Checks {
		row := Row{Group: c.Group, Name: c.Name, Target: describeTarget(c.Target), Expect: c.Expect, Control: c.Control, kind: c.Target.Kind}
		pr, ok := byID[c.Target.ID]
		if ok && isLayer2(c) {
			row.Observed, row.Detail = observeLayer2(c, pr, p.Layer2, l2)
			row.Outcome, row.ElapsedMS = pr.Outcome, pr.ElapsedMS
		} else if ok {
			row.Observed, row.Detail = observe(c, pr)
			row.Outcome, row.ElapsedMS = pr.Outcome, pr.ElapsedMS
			row.idmap = pr.IDMap
		} else {
			row.Observed, row.Detail = Missing, "the probe's report has no result for this check"
		}
		res.Rows = append(res.Rows, row)
	}
	for i := range res.Rows {
		row := &res.Rows[i]
		if row.Observed == row.Expect {
			row.Status = Pass
		} else {
			row.Status = Fail
			if row.Control {
				res.ControlsOK = false
			}
		}
	}
	if !res.ControlsOK {
		for i := range res.Rows {
			if row := &res.Rows[i]; row.Status == Pass && row.Expect == Blocked {
				row.Status = Unproven
			}
		}
	}
	for i := range res.Rows {
		res.Rows[i].Why = why(res.Rows[i])
	}
	res.Pass = res.Passed()
	return res
}

// why explains a row that did not pass.
func why(r Row) string {
	switch {
	case r.Status == Pass:
		return ""
	case r.Status == Unproven:
		return "blocked as expected, but a positive control failed: a dead network would look the same"
	case r.Observed == Errored || r.Observed == Missing:
		return "the probe gave no usable answer: nothing is known about this path"
	case r.Control:
		return "positive control failed: the network under test does not work, so no blocked row proves anything"
	case r.Expect == Reachable:
		return "expected to work and does not: the sandbox lacks connectivity the policy promises"
	}
	switch r.Group {
	case GroupControlPlane:
		return "LEAK: the guest reaches the host's control plane"
	case GroupMetadata:
		return "LEAK: the guest reaches a cloud metadata service (credentials)"
	case GroupOtherZone:
		return "LEAK: the guest reaches another sandbox"
	case GroupLAN:
		return "LEAK: the guest reaches the operator's network"
	case GroupInternet:
		return "LEAK: the guest has egress although the policy forbids it"
	case GroupDNS:
		return "LEAK: the zone resolver recurses for external names (a DNS tunnel out)"
	case GroupIPv6:
		return "LEAK: IPv6 leaves the node"
	case GroupEgress:
		if strings.HasPrefix(r.Target, string(probe.KindKeepAlive)+" ") {
			return "LEAK: a connection opened under the old egress policy still works after a policy change"
		}
		return "LEAK: the egress policy lets through a name or address it does not allow"
	case GroupLayer2:
		return "LEAK: a forged frame from the guest reaches a sibling VM or the node (spoofing, ARP poisoning)"
	case GroupContainer:
		return whyContainer(r.kind)
	}
	return "LEAK: reachable although the policy says blocked"
}

// leaseRow is the DHCP-lease control: an IPv4 (in the subnet) on the
// interface of the IPv4 default route, which goes via the zone gateway.
func leaseRow(l Lease, f probe.Facts) Row {
	row := Row{Group: GroupControl, Name: "DHCP lease", Target: "local: IPv4 and default route", Expect: Present, Control: true, Observed: Absent}
	rt := f.DefaultRoute4
	if rt == nil {
		row.Detail = "no IPv4 default route"
		if len(f.Errors) > 0 {
			row.Detail += "; probe errors: " + strings.Join(f.Errors, "; ")
		}
		return row
	}
	var lease netip.Prefix
	var seen []string
	for _, ifc := range f.Interfaces {
		if ifc.Name != rt.Iface {
			continue
		}
		for _, s := range ifc.Addrs {
			pfx, err := netip.ParsePrefix(s)
			if err != nil || !pfx.Addr().Is4() || pfx.Addr().IsLoopback() || pfx.Addr().IsLinkLocalUnicast() {
				continue
			}
			seen = append(seen, s)
			if !lease.IsValid() && (!l.Subnet.IsValid() || l.Subnet.Contains(pfx.Addr())) {
				lease = pfx
			}
		}
	}
	via := "default via " + rt.Gateway
	if rt.Gateway == "" {
		via = "default route without gateway"
	}
	switch {
	case !lease.IsValid() && len(seen) == 0:
		row.Detail = fmt.Sprintf("no IPv4 address on %s (%s)", rt.Iface, via)
	case !lease.IsValid():
		row.Detail = fmt.Sprintf("%s on %s, none inside %s", strings.Join(seen, ", "), rt.Iface, l.Subnet)
	case l.Gateway.IsValid() && rt.Gateway != l.Gateway.String():
		row.Detail = fmt.Sprintf("%s on %s, but %s, want via %s", lease, rt.Iface, via, l.Gateway)
	default:
		row.Observed = Present
		row.Detail = fmt.Sprintf("%s on %s, %s", lease, rt.Iface, via)
		if len(f.Resolvers) > 0 {
			row.Detail += "; resolv.conf: " + strings.Join(f.Resolvers, ", ")
		}
	}
	return row
}

// observe classifies one probe result for a check and says why.
func observe(c Check, r probe.Result) (Verdict, string) {
	timeout := time.Duration(c.Target.TimeoutMS) * time.Millisecond
	if timeout == 0 {
		timeout = probe.DefaultTimeout * time.Millisecond
	}
	with := func(s string) string {
		if r.Detail != "" {
			return s + " (" + r.Detail + ")"
		}
		return s
	}
	if c.Target.Kind == probe.KindUDP {
		return observeUDP(c, r, timeout, with)
	}
	if isContainerRow(c) {
		return observeContainer(c, r)
	}
	switch r.Outcome {
	case probe.OutcomeOpen:
		if c.Target.Kind == probe.KindKeepAlive {
			return Blocked, with("the old connection was cut")
		}
		if c.NeedResponse {
			return Blocked, with("connected, but closed before any HTTP response: refused")
		}
		if r.Detail != "" {
			return Reachable, "TCP connected: " + r.Detail
		}
		return Reachable, "TCP connected"
	case probe.OutcomeRefused:
		return Reachable, with("refused: a route exists")
	case probe.OutcomeTimeout:
		return Blocked, fmt.Sprintf("no answer within %v", timeout)
	case probe.OutcomeUnreachable:
		return Blocked, with("unreachable")
	case probe.OutcomeNoReply:
		return Blocked, fmt.Sprintf("no DNS reply within %v", timeout)
	case probe.OutcomeResponse:
		if r.RCode != "" {
			d := fmt.Sprintf("%s, %d answers", r.RCode, r.Answers)
			if r.Answers == 1 {
				d = r.RCode + ", 1 answer"
			}
			if c.NeedAnswer && (r.RCode != "NOERROR" || r.Answers == 0) {
				return Blocked, d + ": the name does not resolve"
			}
			return Reachable, d
		}
		return Reachable, with(fmt.Sprintf("HTTP %d", r.HTTPStatus))
	case probe.OutcomeError:
		return Errored, with("probe could not try")
	}
	return Errored, "unknown outcome " + string(r.Outcome)
}

// describeTarget renders a target for the table.
func describeTarget(t probe.Target) string {
	if d := describeLayer2(t); d != "" {
		return d
	}
	if slices.Contains(probe.LocalKinds, t.Kind) {
		return describeContainer(t)
	}
	switch t.Kind {
	case probe.KindHTTP, probe.KindHTTPS:
		m := t.Method
		if m == "" {
			m = "GET"
		}
		if t.Name != "" {
			host := t.Host
			if host == "" {
				host = t.Name
			}
			_, port, _ := net.SplitHostPort(t.Addr)
			return fmt.Sprintf("%s %s %s:%s%s at the address of %s (via %s)", t.Kind, m, host, port, t.Path, t.Name, t.Resolver)
		}
		return fmt.Sprintf("%s %s %s%s", t.Kind, m, t.Addr, t.Path)
	case probe.KindDNS:
		q := t.QType
		if q == "" {
			q = "A"
		}
		return fmt.Sprintf("dns %s %s %s", t.Addr, t.Name, q)
	case probe.KindUDP:
		return describeUDP(t)
	}
	return fmt.Sprintf("%s %s", t.Kind, t.Addr)
}

// WriteText renders the result as a table with a summary line.
func (r *Result) WriteText(w io.Writer) error {
	failed := len(r.Failed())
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	controls := "controls ok"
	if !r.ControlsOK {
		controls = "CONTROLS FAILED: the network under test is not working, blocked rows prove nothing"
	}
	if _, err := fmt.Fprintf(w, "containment check (policy %s): %s, %d of %d rows not passed, %s\n",
		r.Policy, verdict, failed, len(r.Rows), controls); err != nil {
		return err
	}
	if r.Sampling != nil {
		if _, err := fmt.Fprintln(w, r.Sampling.String()); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tCHECK\tTARGET\tEXPECTED\tOBSERVED\tRESULT\tDETAIL")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Group, row.Name, row.Target, row.Expect, row.Observed, row.Status, row.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	unproven := 0
	for _, row := range r.Rows {
		switch row.Status {
		case Fail:
			if _, err := fmt.Fprintf(w, "FAIL %s: %s\n", row.Name, row.Why); err != nil {
				return err
			}
		case Unproven:
			unproven++
		}
	}
	if unproven > 0 {
		if _, err := fmt.Fprintf(w, "UNPROVEN %d rows: blocked as expected, but a positive control failed: a dead network would look the same\n", unproven); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON writes the result as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	r.Pass = r.Passed()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
