package firewall

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
)

// TestDumperMatchesLibrary: the dumper's whole-table rule dump and its set
// element dumps read what google/nftables reads per chain and per set, on
// the guard's own tables with members in an interval set, a concatenated
// set with timeouts and the zone sets; a foreign rule holding an
// expression the guard never writes is named by the dumper (the library
// drops the expression silently) and a verify reports it.
func TestDumperMatchesLibrary(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.Private4Allow = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24")}
	g, err := New(cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Members for the dynamic sets (a concatenation with timeouts), as
	// the egress resolver adds them; the table is the guard's (owner), so
	// through its connection.
	learned := &nftables.Set{Table: &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}, Name: SetEgressLearnedPorts4}
	if err := g.conn.SetAddElements(learned, []nftables.SetElement{
		{Key: concatKey([]byte("vnetA\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), []byte{192, 0, 2, 7}, []byte{1, 187}), Timeout: time.Hour},
		{Key: concatKey([]byte("vnetB\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), []byte{198, 51, 100, 9}, []byte{0, 80}), Timeout: time.Hour},
	}); err != nil {
		t.Fatal(err)
	}
	if err := g.conn.Flush(); err != nil {
		t.Fatal(err)
	}
	lib, err := nftables.New(nftables.WithNetNSFd(int(n.Handle())))
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDumper(g.opts.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	compare := func(t *testing.T) {
		t.Helper()
		for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
			tbl := &nftables.Table{Name: TableName, Family: fam}
			ours, err := d.rules(fam, TableName)
			if err != nil {
				t.Fatal(err)
			}
			chains, err := lib.ListChainsOfTableFamily(fam)
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for _, ch := range chains {
				if ch.Table.Name != TableName {
					continue
				}
				want, err := lib.GetRules(tbl, ch)
				if err != nil {
					t.Fatal(err)
				}
				got := ours.byChain[ch.Name]
				seen += len(got)
				if len(got) != len(want) {
					t.Errorf("%v %s: %d rules, the library reads %d", fam, ch.Name, len(got), len(want))
					continue
				}
				for i := range want {
					if got[i].Handle != want[i].Handle || !bytes.Equal(got[i].UserData, want[i].UserData) || got[i].Chain.Name != ch.Name {
						t.Errorf("%v %s rule %d: handle %d %q, the library %d %q", fam, ch.Name, i, got[i].Handle, ruleComment(got[i]), want[i].Handle, ruleComment(want[i]))
					}
					if _, unknown := ours.unknown[got[i]]; unknown {
						continue // the library leaves the expression out
					}
					gb, err1 := normalizedExprs(fam, got[i].Exprs)
					wb, err2 := normalizedExprs(fam, want[i].Exprs)
					if err := errors.Join(err1, err2); err != nil {
						t.Fatal(err)
					}
					if !slices.EqualFunc(gb, wb, bytes.Equal) {
						t.Errorf("%v %s rule %q: expressions differ from the library's", fam, ch.Name, ruleComment(got[i]))
					}
				}
			}
			total := 0
			for _, rs := range ours.byChain {
				total += len(rs)
			}
			if total != seen || total == 0 {
				t.Errorf("%v: the dump holds %d rules, the chains %d", fam, total, seen)
			}
			sets, err := lib.GetSets(tbl)
			if err != nil {
				t.Fatal(err)
			}
			nonEmpty := 0
			for _, s := range sets {
				want, err := lib.GetSetElements(s)
				if err != nil {
					t.Fatal(err)
				}
				got, err := d.setElements(fam, TableName, s.Name)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(elemKeys(got), elemKeys(want)) {
					t.Errorf("set %s: %v, the library reads %v", s.Name, elemKeys(got), elemKeys(want))
				}
				if len(got) > 0 {
					nonEmpty++
				}
				if s.Name == SetEgressLearnedPorts4 && len(got) != 2 {
					t.Errorf("set %s: %d elements, want the 2 added", s.Name, len(got))
				}
			}
			if fam == nftables.TableFamilyINet && nonEmpty < 8 {
				t.Errorf("only %d sets with members: the comparison proves little", nonEmpty)
			}
		}
	}
	t.Run("the guard's tables", compare)

	// The guard gone (the table orphaned, persist), a foreign edit.
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := n.nft(t, `insert rule inet pve-inspect prerouting meta mark set numgen inc mod 2 comment "foreign"`); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}
	t.Run("with a foreign numgen rule", func(t *testing.T) {
		compare(t)
		ours, err := d.rules(nftables.TableFamilyINet, TableName)
		if err != nil {
			t.Fatal(err)
		}
		first := ours.byChain["prerouting"][0]
		if ours.unknown[first] != "numgen" || ruleComment(first) != "foreign" {
			t.Errorf("the foreign rule: comment %q, unknown expression %q, want foreign and numgen", ruleComment(first), ours.unknown[first])
		}
		// The same rule in place of the first desired one: only the
		// unknown expression tells them apart.
		var want *ChainSpec
		for _, c := range g.desired.Chains {
			if c.Name == "prerouting" {
				want = c
			}
		}
		ours.byChain["prerouting"][0].UserData = ours.byChain["prerouting"][1].UserData
		ds := diffRules(nftables.TableFamilyINet, want, ours.byChain["prerouting"][:len(want.Rules)], ours.unknown, nil)
		if len(ds) == 0 || !strings.Contains(ds[0].Detail, "numgen") {
			t.Errorf("diff of a rule with an unknown expression: %v", ds)
		}
	})
}

// concatKey is the key of a concatenated set element: each part padded
// to 4 bytes (the kernel's NFT_REG32 alignment).
func concatKey(parts ...[]byte) []byte {
	var k []byte
	for _, p := range parts {
		k = append(k, p...)
		for len(k)%4 != 0 {
			k = append(k, 0)
		}
	}
	return k
}

// TestDumpErrors: a dump of a table or set that does not exist is the
// kernel's error, and the socket stays usable.
func TestDumpErrors(t *testing.T) {
	n := basicNode(t)
	h := n.Handle()
	d, err := newDumper(&h)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.setElements(nftables.TableFamilyINet, TableName, "nosuch"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("elements of a set of a missing table: %v, want ENOENT", err)
	}
	rs, err := d.rules(nftables.TableFamilyINet, "nosuch")
	if err != nil && !strings.Contains(err.Error(), "no such file") {
		t.Errorf("rules of a missing table: %v, want none or ENOENT", err)
	}
	if len(rs.byChain) != 0 {
		t.Errorf("rules of a missing table: %v", rs.byChain)
	}
	if out, err := n.nft(t, "add table inet pve-inspect; add set inet pve-inspect s { type ipv4_addr; flags interval; elements = { 10.0.0.0/8 } }"); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}
	els, err := d.setElements(nftables.TableFamilyINet, TableName, "s")
	if err != nil || len(els) == 0 {
		t.Fatalf("after the errors: %v %v", els, err)
	}
}

// TestGuardWithManyDescriptors: a guard keeps working once its process
// holds more than 1024 descriptors (a busy daemon: agent sockets, API
// connections). google/nftables waits with pselect(2) on an fd_set, which
// panics for a descriptor of 1024 or more, so the guard opens every
// socket it reads or writes on in New; a metrics scrape used to dial one
// per scrape.
func TestGuardWithManyDescriptors(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(g.Collector()); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for len(held) == 0 || held[len(held)-1].Fd() < 1100 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatalf("open descriptor %d: %v", len(held), err)
		}
		held = append(held, f)
	}
	ctx := context.Background()
	if err := g.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.SetZones(ctx, map[string][]string{"z9": {"vnetB"}}); err != nil {
		t.Fatal(err)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if v := gaugeValue(t, reg, "pve_inspect_guard_scrape_error"); v != 0 {
		t.Errorf("scrape_error = %v with %d descriptors held", v, len(held))
	}
}
