package firewall

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ruleMessage is a NEWRULE payload as the kernel sends it: table, chain,
// handle and the expressions as a nested list.
func ruleMessage(t testing.TB, es ...expr.Any) []byte {
	t.Helper()
	var list []netlink.Attribute
	for _, e := range es {
		b, err := expr.Marshal(byte(nftables.TableFamilyINet), e)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	exprs, err := netlink.MarshalAttributes(list)
	if err != nil {
		t.Fatal(err)
	}
	handle := make([]byte, 8)
	binary.BigEndian.PutUint64(handle, 7)
	b, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte("forward\x00")},
		{Type: unix.NFTA_RULE_HANDLE, Data: handle},
		{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: exprs},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// elemMessage is a NEWSETELEM payload with one interval start and its end.
func elemMessage(t testing.TB) []byte {
	t.Helper()
	key := func(v []byte) []byte {
		b, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: v}})
		return b
	}
	flags := make([]byte, 4)
	binary.BigEndian.PutUint32(flags, unix.NFT_SET_ELEM_INTERVAL_END)
	e1, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: key([]byte{10, 0, 0, 0})}})
	e2, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: key([]byte{11, 0, 0, 0})}, {Type: unix.NFTA_SET_ELEM_FLAGS, Data: flags}})
	list, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: e1}, {Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: e2}})
	b, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(TableName + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte("private4\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func seedExprs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("vnetA\x00")},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// TestParseRuleRoundTrip: a rule as the kernel sends it parses back to the
// expressions it was made of, the verdict included; an expression the
// guard does not know is named, not kept.
func TestParseRuleRoundTrip(t *testing.T) {
	want := seedExprs()
	r, unknown, err := parseRule(nftables.TableFamilyINet, ruleMessage(t, want...))
	if err != nil || unknown != "" {
		t.Fatalf("parse: %v %q", err, unknown)
	}
	if r.Handle != 7 || r.Chain.Name != "forward" || r.Table.Name != TableName {
		t.Errorf("rule %+v", r)
	}
	gb, err1 := normalizedExprs(nftables.TableFamilyINet, r.Exprs)
	wb, err2 := normalizedExprs(nftables.TableFamilyINet, want)
	if err1 != nil || err2 != nil || !slices.EqualFunc(gb, wb, bytes.Equal) {
		t.Errorf("expressions %v, want %v (%v %v)", r.Exprs, want, err1, err2)
	}
	r, unknown, err = parseRule(nftables.TableFamilyINet, ruleMessage(t, &expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_INCREMENTAL}, &expr.Counter{}))
	if err != nil || unknown != "numgen" || len(r.Exprs) != 1 {
		t.Errorf("a rule with numgen: %v %q %v", err, unknown, r)
	}
	els, err := parseSetElements(elemMessage(t))
	if err != nil || len(els) != 2 || els[0].IntervalEnd || !els[1].IntervalEnd || !bytes.Equal(els[1].Key, []byte{11, 0, 0, 0}) {
		t.Errorf("elements %+v %v", els, err)
	}
}

// FuzzParseRule: a reply of any shape is an error or a rule, never a
// panic, and what parses marshals again.
func FuzzParseRule(f *testing.F) {
	f.Add(ruleMessage(f, seedExprs()...))
	f.Add(ruleMessage(f, &expr.Notrack{}, &expr.Lookup{SourceRegister: 1, SetName: "mgmt"}))
	f.Add(ruleMessage(f, &expr.Dynset{SrcRegKey: 1, SetName: "egress_denied", Operation: 1, Exprs: []expr.Any{&expr.Counter{}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, _, err := parseRule(nftables.TableFamilyINet, b)
		if err != nil {
			return
		}
		if r.Chain == nil {
			t.Fatal("a rule without a chain parsed")
		}
		_, _ = normalizedExprs(nftables.TableFamilyINet, r.Exprs)
	})
}

// FuzzParseSetElements: never a panic.
func FuzzParseSetElements(f *testing.F) {
	f.Add(elemMessage(f))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		els, err := parseSetElements(b)
		if err == nil {
			_ = elemKeys(els)
		}
	})
}

// TestExprCache: the cached expressions of a desired rule are what
// normalizedExprs makes, made once; a nil cache computes them.
func TestExprCache(t *testing.T) {
	w := &RuleSpec{Comment: "x", Exprs: seedExprs()}
	want, err := normalizedExprs(nftables.TableFamilyINet, w.Exprs)
	if err != nil {
		t.Fatal(err)
	}
	c := newExprCache()
	a, err1 := c.of(nftables.TableFamilyINet, w)
	b, err2 := c.of(nftables.TableFamilyINet, w)
	if err1 != nil || err2 != nil || !slices.EqualFunc(a, want, bytes.Equal) || &a[0][0] != &b[0][0] {
		t.Errorf("cached %v %v (same backing array: %v)", err1, err2, &a[0][0] == &b[0][0])
	}
	var nilCache *exprCache
	if got, err := nilCache.of(nftables.TableFamilyINet, w); err != nil || !slices.EqualFunc(got, want, bytes.Equal) {
		t.Errorf("nil cache: %v", err)
	}
	other := &RuleSpec{Comment: "x", Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}}
	if got, _ := c.of(nftables.TableFamilyINet, other); slices.EqualFunc(got, want, bytes.Equal) {
		t.Error("another rule got the first one's expressions")
	}
}
