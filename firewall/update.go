package firewall

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// The update path (issue 29): a change of the node (a new bridge, a port
// moved, a zone added, a lockdown flip) changes a few members of a few
// sets. The guard computes those members from what changed, sends them
// as one batch, and patches its desired rulesets in place (under mu;
// Desired and BridgeDesired hand out copies) instead of rendering them
// again: the work and the netlink traffic are those of the change, not
// of the node. Render stays the definition: Start, repairs and a
// structural change (management, trusted, uplink subnets, egress
// policies) render the whole table, and the periodic verify compares the
// patched sets with a fresh rendering (reconcileLocked).

// member is one set member with its readable form.
type member struct {
	key  []byte
	text string
}

// setChange is the members one set gains and loses.
type setChange struct {
	bridge   bool // the set is in table bridge pve-inspect
	set      string
	add, del []member
}

func (c *setChange) empty() bool { return len(c.add) == 0 && len(c.del) == 0 }

// changes collects set changes by table and set.
type changes struct{ list []*setChange }

func (cs *changes) of(bridge bool, set string) *setChange {
	for _, c := range cs.list {
		if c.bridge == bridge && c.set == set {
			return c
		}
	}
	c := &setChange{bridge: bridge, set: set}
	cs.list = append(cs.list, c)
	return c
}

// has reports whether the set holds a member with text (Text is sorted).
func has(s *SetSpec, text string) bool {
	_, ok := slices.BinarySearch(s.Text, text)
	return ok
}

// effective returns the members of c that change s: deletions that are
// there, additions that are not (Text is sorted). A member both deleted
// and added stays as it is: neither is sent.
func effective(s *SetSpec, c *setChange) (added, deleted []member) {
	in := func(m member) bool {
		i, ok := slices.BinarySearch(s.Text, m.text)
		return ok && bytes.Equal(s.Elements[i].Key, m.key)
	}
	adds, dels := map[string]bool{}, map[string]bool{}
	for _, m := range c.add {
		adds[m.text] = true
	}
	for _, m := range c.del {
		if !dels[m.text] && !adds[m.text] && in(m) {
			dels[m.text] = true
			deleted = append(deleted, m)
		}
	}
	seen := map[string]bool{}
	for _, m := range c.add {
		if !seen[m.text] && !in(m) {
			seen[m.text] = true
			added = append(added, m)
		}
	}
	return added, deleted
}

// patch applies deletions and additions to s in place, keeping Text
// sorted and Elements in step with it.
func patch(s *SetSpec, added, deleted []member) {
	for _, m := range deleted {
		if i, ok := slices.BinarySearch(s.Text, m.text); ok {
			s.Elements, s.Text = slices.Delete(s.Elements, i, i+1), slices.Delete(s.Text, i, i+1)
		}
	}
	for _, m := range added {
		if i, ok := slices.BinarySearch(s.Text, m.text); !ok {
			s.Elements = slices.Insert(s.Elements, i, nftables.SetElement{Key: m.key})
			s.Text = slices.Insert(s.Text, i, m.text)
		}
	}
}

// commitLocked sends the changes as one batch and, once the kernel took
// it, patches the desired rulesets in place. It returns how many members
// changed.
func (g *Guard) commitLocked(cs *changes) (int, error) {
	start := g.opts.now()
	type applied struct {
		s              *SetSpec
		added, deleted []member
	}
	var todo []applied
	total := 0
	for _, c := range cs.list {
		if c.empty() {
			continue
		}
		rs := g.desired
		if c.bridge {
			rs = g.bridge
		}
		if rs == nil {
			return 0, fmt.Errorf("update set %s: table not rendered", c.set)
		}
		cur := rs.Set(c.set)
		if cur == nil || cur.Interval || cur.Dynamic {
			return 0, fmt.Errorf("update set %s: not a plain set of the table", c.set)
		}
		added, deleted := effective(cur, c)
		if len(added)+len(deleted) == 0 {
			continue
		}
		obj := &nftables.Set{Table: &nftables.Table{Name: TableName, Family: rs.family()}, Name: c.set, KeyType: cur.KeyType}
		if err := queueMembers(g.conn, obj, added, deleted); err != nil {
			return 0, err
		}
		todo = append(todo, applied{cur, added, deleted})
		total += len(added) + len(deleted)
	}
	if total == 0 {
		return 0, nil
	}
	if err := g.conn.Flush(); err != nil {
		return 0, fmt.Errorf("update sets: %w", err)
	}
	g.gen++
	g.met.observeApply(g.opts.now().Sub(start))
	for _, a := range todo {
		patch(a.s, a.added, a.deleted)
	}
	return total, nil
}

// snapshot copies rs deeply enough that later patches do not show: its
// sets and their members (chains and rules are never patched).
func (rs *Ruleset) snapshot() *Ruleset {
	if rs == nil {
		return nil
	}
	n := *rs
	n.Sets = make([]*SetSpec, len(rs.Sets))
	for i, s := range rs.Sets {
		c := *s
		c.Elements, c.Text = slices.Clone(s.Elements), slices.Clone(s.Text)
		n.Sets[i] = &c
	}
	return &n
}

func queueMembers(c *nftables.Conn, set *nftables.Set, add, del []member) error {
	els := func(ms []member) []nftables.SetElement {
		out := make([]nftables.SetElement, len(ms))
		for i, m := range ms {
			out[i] = nftables.SetElement{Key: m.key}
		}
		return out
	}
	if len(del) > 0 {
		if err := c.SetDeleteElements(set, els(del)); err != nil {
			return fmt.Errorf("queue element removal of set %s: %w", set.Name, err)
		}
	}
	if len(add) > 0 {
		if err := c.SetAddElements(set, els(add)); err != nil {
			return fmt.Errorf("queue elements of set %s: %w", set.Name, err)
		}
	}
	return nil
}

// ifMember is the member of an interface-name set.
func ifMember(n string) member { return member{key: ifname(n), text: n} }

// pairMember is the member of @zone_peers for (a, b).
func pairMember(a, b string) member {
	return member{key: append(ifname(a), ifname(b)...), text: a + " . " + b}
}

// sortedDiff returns what b has that a lacks and what a has that b
// lacks; both are sorted.
func sortedDiff(a, b []string) (added, removed []string) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			removed = append(removed, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			added = append(added, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

// enslavedDiff returns the ports whose bridge changed from a to b (sorted
// by port): before is "" for a new port, after "" for one gone.
func enslavedDiff(a, b []Enslaved) (moves []portMove) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Port < b[j].Port):
			moves = append(moves, portMove{port: a[i].Port, before: a[i].Bridge})
			i++
		case i == len(a) || b[j].Port < a[i].Port:
			moves = append(moves, portMove{port: b[j].Port, after: b[j].Bridge})
			j++
		default:
			if a[i].Bridge != b[j].Bridge {
				moves = append(moves, portMove{port: a[i].Port, before: a[i].Bridge, after: b[j].Bridge})
			}
			i++
			j++
		}
	}
	return moves
}

type portMove struct{ port, before, after string }

// normalized returns rs with the members of every plain set in the order
// of their text (Render keeps most in that order already; the patches
// rely on it). Rules and other sets are shared with rs.
func normalized(rs *Ruleset) *Ruleset {
	if rs == nil {
		return nil
	}
	n := *rs
	n.Sets = slices.Clone(rs.Sets)
	for i, s := range n.Sets {
		if s.Interval || s.Dynamic || len(s.Text) != len(s.Elements) || slices.IsSorted(s.Text) {
			continue
		}
		idx := make([]int, len(s.Text))
		for j := range idx {
			idx[j] = j
		}
		slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(s.Text[a], s.Text[b]) })
		c := *s
		c.Elements, c.Text = make([]nftables.SetElement, len(idx)), make([]string, len(idx))
		for j, k := range idx {
			c.Elements[j], c.Text[j] = s.Elements[k], s.Text[k]
		}
		n.Sets[i] = &c
	}
	return &n
}

// membersOf returns the members of s by key (and key end).
func membersOf(s *SetSpec) map[string]member {
	out := make(map[string]member, len(s.Elements))
	for i, e := range s.Elements {
		t := ""
		if i < len(s.Text) {
			t = s.Text[i]
		}
		out[string(e.Key)+"\x00"+string(e.KeyEnd)] = member{key: e.Key, text: t}
	}
	return out
}

// replaceSmall queues the difference between set's members and want (a
// small set: lockdown, fail-closed).
func (g *Guard) replaceSmall(cs *changes, set string, want *SetSpec) {
	cur := g.desired.Set(set)
	have, next := membersOf(cur), membersOf(want)
	c := cs.of(false, set)
	for k, m := range next {
		if _, ok := have[k]; !ok {
			c.add = append(c.add, m)
		}
	}
	for k, m := range have {
		if _, ok := next[k]; !ok {
			c.del = append(c.del, m)
		}
	}
}

// errStructural says a change needs the whole table rendered.
var errStructural = fmt.Errorf("change needs a full rendering")

// interfaceDelta queues the members of table inet that the interfaces
// names bring (add) or take away: the rendering of a node with only
// those interfaces and no zones, less the rendering of a node with none.
// That is each interface's self pair in @zone_peers and its egress
// members, whatever the egress policy makes of it. A difference in an
// interval set is errStructural.
func (g *Guard) interfaceDelta(cs *changes, cls Classification, names []string, add bool) error {
	if len(names) == 0 {
		return nil
	}
	cfg := g.egressConfig()
	base := Classification{Management: cls.Management, Trusted: cls.Trusted, UplinkNets: cls.UplinkNets}
	with := base
	with.Interfaces = names
	r0, err := Render(cfg, base, g.sw)
	if err != nil {
		return err
	}
	r1, err := Render(cfg, with, g.sw)
	if err != nil {
		return err
	}
	for _, s1 := range r1.Sets {
		s0 := r0.Set(s1.Name)
		if s0 == nil || s1.Dynamic {
			continue
		}
		before := membersOf(s0)
		c := cs.of(false, s1.Name)
		for k, m := range membersOf(s1) {
			if _, ok := before[k]; ok {
				continue
			}
			if s1.Interval {
				return errStructural
			}
			if add {
				c.add = append(c.add, m)
			} else if !(s1.Name == SetZonePeers && g.pairInZoneLocked(m.text)) {
				c.del = append(c.del, m)
			}
		}
	}
	return nil
}

// pairInZoneLocked reports whether the @zone_peers member text ("a . b")
// comes from a zone too.
func (g *Guard) pairInZoneLocked(text string) bool {
	a, b, _ := strings.Cut(text, " . ")
	for _, z := range g.zoneOf[a] {
		if slices.Contains(g.mergedZones[z], b) {
			return true
		}
	}
	return false
}

// applyLinksLocked applies a classification that differs from the
// current one only in its interfaces and bridge ports (a new bridge, a
// port moved): the new interfaces' members, and @guest_ports and
// @other_ports for the guest ports that joined, left or moved.
func (g *Guard) applyLinksLocked(ctx context.Context, cls Classification) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cs := &changes{}
	added, removed := sortedDiff(g.state.Interfaces, cls.Interfaces)
	if err := g.interfaceDelta(cs, cls, added, true); err != nil {
		return err
	}
	if err := g.interfaceDelta(cs, cls, removed, false); err != nil {
		return err
	}
	for _, m := range enslavedDiff(g.state.Enslaved, cls.Enslaved) {
		if !isGuestPortName(m.port) {
			continue
		}
		g.queuePortSets(cs, m.port, m.before, false)
		g.queuePortSets(cs, m.port, m.after, true)
	}
	if _, err := g.commitLocked(cs); err != nil {
		return err
	}
	g.state = cls
	return nil
}

// indexZonesLocked records the merged zones (configured and run-time) and
// the zones of each bridge, which the patches consult.
func (g *Guard) indexZonesLocked(zones map[string][]string) {
	g.mergedZones = g.renderConfig(zones).Zones
	g.zoneOf = map[string][]string{}
	for id, bs := range g.mergedZones {
		for _, b := range bs {
			g.zoneOf[b] = append(g.zoneOf[b], id)
		}
	}
}

// applyZoneChangesLocked applies new run-time zones by what changed: the
// pairs of the zones that changed, and @guest_ports for the bridges that
// joined or left every zone.
func (g *Guard) applyZoneChangesLocked(ctx context.Context, zones map[string][]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	oldMerged, oldOf := g.mergedZones, g.zoneOf
	newMerged := g.renderConfig(zones).Zones
	var changed []string
	for id, bs := range newMerged {
		if !slices.Equal(oldMerged[id], bs) {
			changed = append(changed, id)
		}
	}
	for id := range oldMerged {
		if _, ok := newMerged[id]; !ok {
			changed = append(changed, id)
		}
	}
	if len(changed) == 0 {
		g.zones = zones
		return nil
	}
	for _, id := range changed {
		for _, b := range newMerged[id] {
			if !portNameRE.MatchString(b) {
				return fmt.Errorf("zone bridge %q: bad interface name", b)
			}
		}
	}
	g.indexZonesLocked(zones)
	cs := &changes{}
	zp := cs.of(false, SetZonePeers)
	flipped := map[string]bool{}
	for _, id := range changed {
		for _, a := range newMerged[id] {
			flipped[a] = len(oldOf[a]) == 0
			for _, b := range newMerged[id] {
				zp.add = append(zp.add, pairMember(a, b))
			}
		}
		for _, a := range oldMerged[id] {
			if len(g.zoneOf[a]) == 0 {
				flipped[a] = true
			}
			for _, b := range oldMerged[id] {
				if !g.pairJustifiedLocked(a, b) {
					zp.del = append(zp.del, pairMember(a, b))
				}
			}
		}
	}
	g.guestPortsOfLocked(cs, flipped)
	if _, err := g.commitLocked(cs); err != nil {
		g.mergedZones, g.zoneOf = oldMerged, oldOf
		return err
	}
	g.zones = zones
	return nil
}

// pairJustifiedLocked reports whether (a, b) stays in @zone_peers with the
// zones indexed now: an interface with itself, two trusted interfaces, or
// two bridges of one zone.
func (g *Guard) pairJustifiedLocked(a, b string) bool {
	if a == b {
		if _, ok := slices.BinarySearch(g.state.Interfaces, a); ok {
			return true
		}
	}
	if slices.Contains(g.state.Trusted, a) && slices.Contains(g.state.Trusted, b) {
		return true
	}
	return g.pairInZoneLocked(a + " . " + b)
}

// queuePortSets queues guest-named port on bridge ("" for none) into
// (add) or out of the set that bridge puts it in: @guest_ports on a zone
// bridge, @other_ports on a bridge of no zone. A move queues both; a
// member both deleted and added stays.
func (g *Guard) queuePortSets(cs *changes, port, bridge string, add bool) {
	if bridge == "" {
		return
	}
	set := SetOtherPorts
	if len(g.zoneOf[bridge]) > 0 {
		set = SetGuestPorts
	}
	c := cs.of(true, set)
	if add {
		c.add = append(c.add, ifMember(port))
	} else {
		c.del = append(c.del, ifMember(port))
	}
}

// guestPortsOfLocked queues @guest_ports and @other_ports for the guest
// ports of the bridges in flipped (true: it may have changed whether the
// bridge is in a zone).
func (g *Guard) guestPortsOfLocked(cs *changes, flipped map[string]bool) {
	any := false
	for _, f := range flipped {
		any = any || f
	}
	if !any {
		return
	}
	gp, op := cs.of(true, SetGuestPorts), cs.of(true, SetOtherPorts)
	for _, e := range g.state.Enslaved {
		if !flipped[e.Bridge] || !isGuestPortName(e.Port) {
			continue
		}
		if len(g.zoneOf[e.Bridge]) > 0 {
			gp.add, op.del = append(gp.add, ifMember(e.Port)), append(op.del, ifMember(e.Port))
		} else {
			gp.del, op.add = append(gp.del, ifMember(e.Port)), append(op.add, ifMember(e.Port))
		}
	}
}

// portMembers are the members one port brings to @ports, @port_mac and
// @port_ip4.
func portMembers(p Port) map[string][]member {
	out := map[string][]member{
		SetPorts:   {ifMember(p.Name)},
		SetPortMAC: {{key: append(ifname(p.Name), append(slices.Clone([]byte(p.MAC)), 0, 0)...), text: p.Name + " . " + p.MAC.String()}},
	}
	for _, a := range p.IPv4 {
		b := a.As4()
		out[SetPortIPv4] = append(out[SetPortIPv4], member{key: append(ifname(p.Name), b[:]...), text: p.Name + " . " + a.String()})
	}
	return out
}

// portChanges queues the members of the ports that differ between the
// sorted port maps cur and next.
func portChanges(cs *changes, cur, next []Port) {
	old := make(map[string]Port, len(cur))
	for _, p := range cur {
		old[p.Name] = p
	}
	queue := func(p Port, add bool) {
		for set, ms := range portMembers(p) {
			c := cs.of(true, set)
			if add {
				c.add = append(c.add, ms...)
			} else {
				c.del = append(c.del, ms...)
			}
		}
	}
	seen := make(map[string]bool, len(next))
	for _, p := range next {
		seen[p.Name] = true
		o, ok := old[p.Name]
		if ok && samePort(o, p) {
			continue
		}
		if ok {
			queue(o, false)
		}
		queue(p, true)
	}
	for _, p := range cur {
		if !seen[p.Name] {
			queue(p, false)
		}
	}
	guestAddrChanges(cs, cur, next)
}

func samePort(a, b Port) bool {
	return a.Name == b.Name && bytes.Equal(a.MAC, b.MAC) && slices.Equal(a.IPv4, b.IPv4)
}

// reconcile renders the whole table from the current state and compares
// its sets with the patched ones in force; a difference is a defect of
// the update path: it is logged and the rendering's members are applied.
// The rendering and the comparison run without mu (at thousands of
// bridges they take longer than any change should wait) on a copy of
// the state; a batch sent meanwhile makes the check wait for the next
// tick.
func (g *Guard) reconcile(ctx context.Context) error {
	g.mu.Lock()
	if g.desired == nil {
		g.mu.Unlock()
		return nil
	}
	gen, cls, sw, ports := g.gen, g.state.clone(), g.sw, g.ports
	cfg := g.renderConfig(g.zones)
	inet, br := g.desired.snapshot(), g.bridge.snapshot()
	g.mu.Unlock()
	differ, err := patchedDiffer(cfg, cls, sw, ports, inet, br)
	if err != nil || len(differ) == 0 {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gen != gen {
		return nil // changed meanwhile: the next tick checks again
	}
	g.log.Error("sets of the update path differ from a full rendering; applying the rendering", "sets", strings.Join(differ, ", "))
	return g.applyZonesLocked(ctx, g.state, g.sw, g.zones)
}

// patchedDifferLocked names the sets whose members in force differ from
// a full rendering of the current state.
func (g *Guard) patchedDifferLocked() ([]string, error) {
	return patchedDiffer(g.renderConfig(g.zones), g.state, g.sw, g.ports, g.desired, g.bridge)
}

// patchedDiffer names the sets of inet and br whose members differ from
// a full rendering of cfg, cls, sw and ports.
func patchedDiffer(cfg Config, cls Classification, sw Switches, ports []Port, inet, br *Ruleset) ([]string, error) {
	rs, err := Render(cfg, cls, sw)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	withGuestAddrs(rs, ports)
	brs, err := RenderBridge(zoneBridges(cfg), cls, ports, cfg.Flood)
	if err != nil {
		return nil, fmt.Errorf("render bridge table: %w", err)
	}
	var differ []string
	for _, p := range [][2]*Ruleset{{inet, rs}, {br, brs}} {
		for _, s := range p[1].Sets {
			cur := p[0].Set(s.Name)
			if cur == nil || (!s.Dynamic && !slices.Equal(elemKeys(cur.Elements), elemKeys(s.Elements))) {
				differ = append(differ, p[1].TableRef()+" set "+s.Name)
			}
		}
	}
	return differ, nil
}
