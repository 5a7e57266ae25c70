package firewall

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

const family = nftables.TableFamilyINet

// DriftKind classifies a difference between the kernel and the desired table.
type DriftKind string

// Kinds of drift; they are also the reason label of the repairs metric.
const (
	DriftTableMissing DriftKind = "table_missing"
	DriftTableFlags   DriftKind = "table_flags"
	DriftTableOwner   DriftKind = "table_owner"
	DriftChain        DriftKind = "chain"
	DriftSet          DriftKind = "set"
	DriftElements     DriftKind = "set_elements"
	DriftRule         DriftKind = "rule"
)

// Drift is one difference between the kernel's table and the desired one.
type Drift struct {
	Kind   DriftKind
	Object string
	Detail string
}

func (d Drift) String() string { return fmt.Sprintf("%s %s: %s", d.Kind, d.Object, d.Detail) }

// DriftError is returned by Verify when the kernel's table differs from the
// desired one.
type DriftError struct {
	Drifts []Drift
}

func (e *DriftError) Error() string {
	parts := make([]string, len(e.Drifts))
	for i, d := range e.Drifts {
		parts[i] = d.String()
	}
	return fmt.Sprintf("table inet %s differs from desired: %s", TableName, strings.Join(parts, "; "))
}

// onlyElements reports whether every drift is a set membership change,
// which is repaired without touching rules (counters stay).
func onlyElements(ds []Drift) bool {
	for _, d := range ds {
		if d.Kind != DriftElements {
			return false
		}
	}
	return len(ds) > 0
}

// kernelTable is the table as the kernel has it.
type kernelTable struct {
	table  *nftables.Table // nil when absent
	chains map[string]*nftables.Chain
	sets   map[string]*nftables.Set
	elems  map[string][]nftables.SetElement
	rules  map[string][]*nftables.Rule
	// unknownExprs are the rules holding an expression the guard does
	// not know, with its name (tableRules).
	unknownExprs map[*nftables.Rule]string
}

// tableReader reads the guard's tables: chains, sets and tables through
// google/nftables, rules and set elements through a dumper (one dump per
// table's rules instead of one per chain, and no peek per read).
type tableReader struct {
	c *nftables.Conn
	d *dumper
}

// openReader opens a reader of its own in o's namespace (for the one-off
// reads of status, metrics and remove). Close it.
func openReader(o options) (*tableReader, error) {
	c, err := nftables.New(o.nftOpts(true)...)
	if err != nil {
		return nil, fmt.Errorf("open nftables connection: %w", err)
	}
	d, err := newDumper(o.ns)
	if err != nil {
		_ = c.CloseLasting()
		return nil, err
	}
	return &tableReader{c: c, d: d}, nil
}

// Close closes both sockets.
func (r *tableReader) Close() error {
	return errors.Join(r.c.CloseLasting(), r.d.Close())
}

// readKernel reads table inet pve-inspect; a missing table is not an error.
func readKernel(r *tableReader) (*kernelTable, error) { return readKernelTable(r, family) }

// readKernelTable reads table pve-inspect of family fam; a missing table
// is not an error.
func readKernelTable(r *tableReader, fam nftables.TableFamily) (*kernelTable, error) {
	return readKernelTableWith(r, fam, func(string) bool { return true })
}

// readKernelTableWith reads table pve-inspect of family fam, the members
// only of the sets elems names (a verify skips the sets it never
// compares, a scrape of counters every set).
func readKernelTableWith(r *tableReader, fam nftables.TableFamily, elems func(set string) bool) (*kernelTable, error) {
	tables, err := r.c.ListTablesOfFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return readTableIn(r, tables, fam, elems)
}

// readKernelTables reads table pve-inspect of every family of want with
// one listing of the tables for all of them (a dump costs a round trip
// and the guard reads two tables per verify), the members only of the
// sets elems names for the family. A missing table is not an error.
func readKernelTables(r *tableReader, want []nftables.TableFamily, elems func(fam nftables.TableFamily) func(set string) bool) (map[nftables.TableFamily]*kernelTable, error) {
	var tables []*nftables.Table
	var err error
	if len(want) == 1 {
		tables, err = r.c.ListTablesOfFamily(want[0])
	} else {
		tables, err = r.c.ListTables()
	}
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	out := make(map[nftables.TableFamily]*kernelTable, len(want))
	for _, fam := range want {
		k, err := readTableIn(r, tables, fam, elems(fam))
		if err != nil {
			return nil, err
		}
		out[fam] = k
	}
	return out, nil
}

// readTableIn reads table pve-inspect of family fam if tables (the
// kernel's, as just listed) holds it.
func readTableIn(r *tableReader, tables []*nftables.Table, fam nftables.TableFamily, elems func(set string) bool) (*kernelTable, error) {
	k := &kernelTable{chains: map[string]*nftables.Chain{}, sets: map[string]*nftables.Set{},
		elems: map[string][]nftables.SetElement{}, rules: map[string][]*nftables.Rule{}}
	for _, t := range tables {
		if t.Name == TableName && t.Family == fam {
			k.table = t
		}
	}
	if k.table == nil {
		return k, nil
	}
	chains, err := r.c.ListChainsOfTableFamily(fam)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != TableName {
			continue
		}
		k.chains[ch.Name] = ch
	}
	rules, err := r.d.rules(fam, TableName)
	if err != nil {
		return nil, err
	}
	k.rules, k.unknownExprs = rules.byChain, rules.unknown
	sets, err := r.c.GetSets(k.table)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		k.sets[s.Name] = s
		if !elems(s.Name) {
			continue
		}
		els, err := r.d.setElements(fam, TableName, s.Name)
		if err != nil {
			return nil, err
		}
		k.elems[s.Name] = els
	}
	return k, nil
}

// comparedSets names the sets whose members diff compares with rs.
func comparedSets(rs *Ruleset) func(string) bool {
	return func(name string) bool {
		s := rs.Set(name)
		return s == nil || !s.Dynamic
	}
}

// ruleComment returns the comment stored in a rule's userdata.
func ruleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// normalizedExprs marshals expressions with the parts that legitimately
// differ between what we send and what the kernel returns cleared: counter
// values and the transaction-local set id.
func normalizedExprs(fam nftables.TableFamily, es []expr.Any) ([][]byte, error) {
	out := make([][]byte, 0, len(es))
	for _, e := range es {
		switch v := e.(type) {
		case *expr.Counter:
			e = &expr.Counter{}
		case *expr.Lookup:
			c := *v
			c.SetID = 0
			e = &c
		case *expr.Dynset:
			c := *v
			c.SetID = 0
			c.Exprs = nil
			for _, x := range v.Exprs {
				if _, ok := x.(*expr.Counter); ok {
					x = &expr.Counter{}
				}
				c.Exprs = append(c.Exprs, x)
			}
			e = &c
		}
		b, err := expr.Marshal(byte(fam), e)
		if err != nil {
			return nil, fmt.Errorf("marshal %T: %w", e, err)
		}
		out = append(out, b)
	}
	return out, nil
}

func elemKeys(els []nftables.SetElement) []string {
	out := make([]string, 0, len(els))
	for _, e := range els {
		k := hex.EncodeToString(e.Key)
		if e.IntervalEnd {
			k += "/end"
		}
		if len(e.KeyEnd) > 0 {
			k += "-" + hex.EncodeToString(e.KeyEnd)
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// diff compares the kernel's table with the desired ruleset. ownerPort is
// the port id the table must be owned by (0: any owner or none accepted,
// used before adoption).
func diff(want *Ruleset, k *kernelTable, ownerPort uint32) []Drift {
	if k.table == nil {
		return []Drift{{DriftTableMissing, want.TableRef(), "absent"}}
	}
	var ds []Drift
	if k.table.Flags&nftables.TableFlagDormant != 0 {
		ds = append(ds, Drift{DriftTableFlags, "table", "dormant: it processes no packets"})
	}
	if k.table.Flags&nftables.TableFlagPersist == 0 {
		ds = append(ds, Drift{DriftTableFlags, "table", fmt.Sprintf("flags %#x lack persist", uint32(k.table.Flags))})
	}
	if ownerPort != 0 && (k.table.Flags&nftables.TableFlagOwner == 0 || k.table.Owner != ownerPort) {
		ds = append(ds, Drift{DriftTableOwner, "table", fmt.Sprintf("owner %d (flags %#x), want %d", k.table.Owner, uint32(k.table.Flags), ownerPort)})
	}
	wantSets := map[string]bool{}
	for _, s := range want.Sets {
		wantSets[s.Name] = true
		ks, ok := k.sets[s.Name]
		if !ok {
			ds = append(ds, Drift{DriftSet, s.Name, "missing"})
			continue
		}
		if ks.Interval != s.Interval || ks.HasTimeout != s.Timeout || ks.KeyType.Bytes != s.KeyType.Bytes || ks.KeyType.GetNFTMagic() != s.KeyType.GetNFTMagic() {
			ds = append(ds, Drift{DriftSet, s.Name, fmt.Sprintf("type %s interval=%v, want %s interval=%v", ks.KeyType.Name, ks.Interval, s.KeyType.Name, s.Interval)})
			continue
		}
		if ks.Dynamic != s.Eval || (s.Size > 0 && ks.Size != s.Size) {
			// a packet-path set made smaller or static stops its rule
			// (an update that cannot add a member does not match)
			ds = append(ds, Drift{DriftSet, s.Name, fmt.Sprintf("dynamic=%v size %d, want dynamic=%v size %d", ks.Dynamic, ks.Size, s.Eval, s.Size)})
			continue
		}
		if !s.Dynamic && !slices.Equal(elemKeys(k.elems[s.Name]), elemKeys(s.Elements)) {
			ds = append(ds, Drift{DriftElements, s.Name, fmt.Sprintf("%d elements, want %d (%s)", len(k.elems[s.Name]), len(s.Elements), strings.Join(s.Text, ", "))})
		}
	}
	for name := range k.sets {
		if !wantSets[name] {
			ds = append(ds, Drift{DriftSet, name, "unexpected"})
		}
	}
	wantChains := map[string]bool{}
	for _, c := range want.Chains {
		wantChains[c.Name] = true
		kc, ok := k.chains[c.Name]
		if !ok {
			ds = append(ds, Drift{DriftChain, c.Name, "missing"})
			continue
		}
		if c.Hook != nil {
			if kc.Hooknum == nil || *kc.Hooknum != *c.Hook || kc.Priority == nil || int32(*kc.Priority) != c.Priority ||
				kc.Type != c.chainType() || (kc.Policy != nil && *kc.Policy != nftables.ChainPolicyAccept) {
				ds = append(ds, Drift{DriftChain, c.Name, "hook, priority, type or policy changed"})
				continue
			}
		} else if kc.Hooknum != nil {
			ds = append(ds, Drift{DriftChain, c.Name, "is a base chain, want a regular chain"})
			continue
		}
		ds = append(ds, diffRules(want.family(), c, k.rules[c.Name], k.unknownExprs, want.norm)...)
	}
	for name := range k.chains {
		if !wantChains[name] {
			ds = append(ds, Drift{DriftChain, name, "unexpected"})
		}
	}
	return ds
}

// exprCache holds the normalized expressions of the desired rules of one
// rendering, by rule (a rendering's rules are never changed in place).
type exprCache struct {
	mu sync.Mutex
	m  map[*RuleSpec][][]byte
}

func newExprCache() *exprCache { return &exprCache{m: map[*RuleSpec][][]byte{}} }

// of returns the normalized expressions of w; a nil cache computes them.
func (c *exprCache) of(fam nftables.TableFamily, w *RuleSpec) ([][]byte, error) {
	if c == nil {
		return normalizedExprs(fam, w.Exprs)
	}
	c.mu.Lock()
	b, ok := c.m[w]
	c.mu.Unlock()
	if ok {
		return b, nil
	}
	b, err := normalizedExprs(fam, w.Exprs)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.m[w] = b
	c.mu.Unlock()
	return b, nil
}

// diffRules compares the rules of chain c read from the kernel with the
// desired ones, their expressions from norm (nil computes them).
func diffRules(fam nftables.TableFamily, c *ChainSpec, got []*nftables.Rule, unknown map[*nftables.Rule]string, norm *exprCache) []Drift {
	var ds []Drift
	if len(got) != len(c.Rules) {
		var names []string
		for _, r := range got {
			names = append(names, ruleComment(r))
		}
		return []Drift{{DriftRule, c.Name, fmt.Sprintf("%d rules [%s], want %d", len(got), strings.Join(names, ","), len(c.Rules))}}
	}
	for i, w := range c.Rules {
		g := got[i]
		if ruleComment(g) != w.Comment {
			ds = append(ds, Drift{DriftRule, c.Name + "/" + w.Comment, fmt.Sprintf("position %d holds %q", i, ruleComment(g))})
			continue
		}
		if name, ok := unknown[g]; ok {
			ds = append(ds, Drift{DriftRule, c.Name + "/" + w.Comment, fmt.Sprintf("holds expression %q, which the guard never writes", name)})
			continue
		}
		wb, err1 := norm.of(fam, w)
		gb, err2 := normalizedExprs(fam, g.Exprs)
		if err := errors.Join(err1, err2); err != nil {
			ds = append(ds, Drift{DriftRule, c.Name + "/" + w.Comment, err.Error()})
			continue
		}
		if !slices.EqualFunc(wb, gb, bytes.Equal) {
			ds = append(ds, Drift{DriftRule, c.Name + "/" + w.Comment, "expressions differ"})
		}
	}
	return ds
}

// nftSets are the library objects for the desired sets of one batch.
type nftSets map[string]*nftables.Set

func newSetObjects(t *nftables.Table, rs *Ruleset) nftSets {
	m := nftSets{}
	for _, s := range rs.Sets {
		set := &nftables.Set{Table: t, Name: s.Name, KeyType: s.KeyType, Interval: s.Interval, Concatenation: s.Concat, HasTimeout: s.Timeout,
			Dynamic: s.Eval, Size: s.Size}
		if s.KeyType.GetNFTMagic() == nftables.TypeIFName.GetNFTMagic() {
			// nft prints strings from host byte order (set userdata)
			set.KeyByteOrder = binaryutil.NativeEndian
		}
		m[s.Name] = set
	}
	return m
}

// queueTable queues the whole table: (optionally) deletion of the existing
// one, then the table with owner|persist, its sets, chains and rules. The
// caller flushes it as one batch.
func queueTable(c *nftables.Conn, rs *Ruleset, deleteFirst bool) error {
	t := &nftables.Table{Name: TableName, Family: rs.family()}
	if deleteFirst {
		c.DelTable(t)
	}
	t = c.AddTable(&nftables.Table{Name: TableName, Family: rs.family(), Flags: TableFlags})
	sets := newSetObjects(t, rs)
	for _, s := range rs.Sets {
		if err := c.AddSet(sets[s.Name], s.Elements); err != nil {
			return fmt.Errorf("queue set %s: %w", s.Name, err)
		}
	}
	chains := map[string]*nftables.Chain{}
	accept := nftables.ChainPolicyAccept
	for _, cs := range rs.Chains {
		ch := &nftables.Chain{Name: cs.Name, Table: t}
		if cs.Hook != nil {
			ch.Hooknum = cs.Hook
			ch.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(cs.Priority))
			ch.Type = cs.chainType()
			ch.Policy = &accept
		}
		chains[cs.Name] = c.AddChain(ch)
	}
	for _, cs := range rs.Chains {
		for _, r := range cs.Rules {
			exprs := make([]expr.Any, len(r.Exprs))
			for i, e := range r.Exprs {
				switch l := e.(type) {
				case *expr.Lookup:
					cp := *l
					s, ok := sets[l.SetName]
					if !ok {
						return fmt.Errorf("rule %s: unknown set %s", r.Comment, l.SetName)
					}
					cp.SetID = s.ID
					e = &cp
				case *expr.Dynset:
					cp := *l
					s, ok := sets[l.SetName]
					if !ok {
						return fmt.Errorf("rule %s: unknown set %s", r.Comment, l.SetName)
					}
					cp.SetID = s.ID
					e = &cp
				}
				exprs[i] = e
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: chains[cs.Name], Exprs: exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.Comment)})
		}
	}
	return nil
}

// elemDelta returns the members of want missing in cur and the members
// of cur missing in want (by key).
func elemDelta(cur, want []nftables.SetElement) (add, del []nftables.SetElement) {
	have := map[string]bool{}
	for _, e := range cur {
		have[hex.EncodeToString(e.Key)] = true
	}
	keep := map[string]bool{}
	for _, e := range want {
		k := hex.EncodeToString(e.Key)
		keep[k] = true
		if !have[k] {
			add = append(add, e)
		}
	}
	for _, e := range cur {
		if !keep[hex.EncodeToString(e.Key)] {
			del = append(del, nftables.SetElement{Key: e.Key})
		}
	}
	return add, del
}

// queueSetUpdates queues, for every set whose members differ from cur (the
// kernel's or the last applied), the difference (plain sets) or a flush
// and a refill (interval sets). Rules and counters are untouched. It returns how many sets it queued.
func queueSetUpdates(c *nftables.Conn, rs *Ruleset, cur map[string][]nftables.SetElement) (int, error) {
	t := &nftables.Table{Name: TableName, Family: rs.family()}
	sets := newSetObjects(t, rs)
	n := 0
	for _, s := range rs.Sets {
		if s.Dynamic || slices.Equal(elemKeys(cur[s.Name]), elemKeys(s.Elements)) {
			continue
		}
		n++
		if !s.Interval {
			// a plain set changes by its difference: a port map of
			// hundreds of members is not resent for one port
			add, del := elemDelta(cur[s.Name], s.Elements)
			if len(del) > 0 {
				if err := c.SetDeleteElements(sets[s.Name], del); err != nil {
					return 0, fmt.Errorf("queue element removal of set %s: %w", s.Name, err)
				}
			}
			if len(add) > 0 {
				if err := c.SetAddElements(sets[s.Name], add); err != nil {
					return 0, fmt.Errorf("queue elements of set %s: %w", s.Name, err)
				}
			}
			continue
		}
		c.FlushSet(sets[s.Name])
		if err := c.SetAddElements(sets[s.Name], s.Elements); err != nil {
			return 0, fmt.Errorf("queue elements of set %s: %w", s.Name, err)
		}
	}
	return n, nil
}
