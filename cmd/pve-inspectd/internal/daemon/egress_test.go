package daemon

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestRunKeepsEgressPolicies: the daemon starts with the policies a
// previous run persisted already in the guard's table (READY comes with
// them in force), serves its resolver and proxy in the guard's namespace,
// and a change through the API's egress part is persisted for the next
// run.
func TestRunKeepsEgressPolicies(t *testing.T) {
	ns := testkit.NewNetNS(t, "pdn").Handle()
	cfg := config.Default()
	testParts(t, &cfg)
	state := `{"version": 1, "zones": [{"zone": "sb-aaaa", "owner": "sb-aaaa", "bridges": ["vnetq"],
		"policy": {"mode": "none"}}]}`
	if err := os.WriteFile(cfg.Egress.StateFile, []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(check func(eg *Egress)) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ready := make(chan struct{})
		var eg *Egress
		d := &Daemon{Config: cfg, GuardOptions: []firewall.Option{firewall.WithNetNS(ns)}, EgressNS: &ns,
			Ready: func() { close(ready) }}
		d.egressHook = func(e *Egress) { eg = e }
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("Run ended before ready: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("no readiness")
		}
		check(eg)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	none := func() []string {
		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseLasting()
		set, err := c.GetSetByName(&nftables.Table{Name: firewall.TableName, Family: nftables.TableFamilyINet}, firewall.SetEgressNone)
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(set)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range els {
			out = append(out, string(trimNUL(e.Key)))
		}
		slices.Sort(out)
		return out
	}
	run(func(eg *Egress) {
		if got := none(); !slices.Equal(got, []string{"vnetq"}) {
			t.Errorf("egress_none at readiness: %v, want the persisted vnetq", got)
		}
		if err := eg.Set(context.Background(), "sb-bbbb", "sb-bbbb", []string{"vnetr"}, apitype.EgressPolicy{Mode: "none"}); err != nil {
			t.Fatal(err)
		}
		if got := none(); !slices.Equal(got, []string{"vnetq", "vnetr"}) {
			t.Errorf("egress_none after Set: %v", got)
		}
	})
	run(func(*Egress) {
		if got := none(); !slices.Equal(got, []string{"vnetq", "vnetr"}) {
			t.Errorf("egress_none after a restart: %v, want both persisted policies", got)
		}
	})
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// TestRunKeepsEgressRecord: the egress record of a sandbox the engine
// still has after a restart is back (its records, seq and counts, and
// the metrics of it), the record of one deleted while the daemon was
// down is not, and its file is removed; a record is saved by the stop
// itself (no save interval passes in this test).
func TestRunKeepsEgressRecord(t *testing.T) {
	ns := testkit.NewNetNS(t, "pdr").Handle()
	cfg := config.Default()
	testParts(t, &cfg)
	run := func(check func(eg *Egress)) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ready := make(chan struct{})
		var eg *Egress
		d := &Daemon{Config: cfg, GuardOptions: []firewall.Option{firewall.WithNetNS(ns)}, EgressNS: &ns,
			Ready: func() { close(ready) }}
		d.egressHook = func(e *Egress) { eg = e }
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("Run ended before ready: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("no readiness")
		}
		check(eg)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	files := func() []string {
		ents, _ := os.ReadDir(cfg.EgressLogDir())
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	var before apitype.EgressLog
	run(func(eg *Egress) {
		if err := eg.RestoreEgress(nil); err != nil { // the engine's reconcile: no sandbox yet
			t.Fatal(err)
		}
		for _, sb := range []string{"sbkeep01", "sbgone01"} {
			r := eg.Record.Open(sb)
			r.Add(egress.Record{Type: egress.RecordDNS, Verdict: egress.VerdictAnswered, Name: "example.org", QType: "A"})
			r.Add(egress.Record{Type: egress.RecordConn, Verdict: egress.VerdictAllowed, Proto: "tcp",
				Dest: netip.MustParseAddrPort("192.0.2.1:443"), Name: "example.org", Check: "sni", BytesOut: 300, BytesIn: 4000})
		}
		before = eg.Log("sbkeep01", sandbox.EgressLogFilter{})
	})
	if got := files(); !slices.Equal(got, []string{"sbgone01.json", "sbkeep01.json"}) {
		t.Fatalf("files after the stop: %v", got)
	}
	run(func(eg *Egress) {
		if l := eg.Log("sbkeep01", sandbox.EgressLogFilter{}); len(l.Records) != 0 {
			t.Errorf("restored before the engine's reconcile: %+v", l)
		}
		if err := eg.RestoreEgress([]string{"sbkeep01"}); err != nil { // sbgone01 was deleted while the daemon was down
			t.Fatal(err)
		}
		after := eg.Log("sbkeep01", sandbox.EgressLogFilter{})
		if len(after.Records) != 2 || after.Records[1].BytesIn != 4000 || after.Records[1].Dest != "192.0.2.1:443" ||
			!after.Records[0].Time.Equal(before.Records[0].Time) || after.Next != before.Next {
			t.Errorf("after the restart %+v, before %+v", after, before)
		}
		if l := eg.Log("sbgone01", sandbox.EgressLogFilter{}); len(l.Records) != 0 {
			t.Errorf("the deleted sandbox's record: %+v", l)
		}
		c, ok := eg.EgressCounts("sbkeep01")
		if !ok || c.Now.BytesOut != 300 || c.Now.Records != 2 || c.Base != c.Now {
			t.Errorf("counts after the restart: %+v %v", c, ok)
		}
		if got := files(); !slices.Equal(got, []string{"sbkeep01.json"}) {
			t.Errorf("files after the restore: %v", got)
		}
	})
}

// TestRecordOfDest: the API shows a destination as address:port, and a
// refused flow (packets the guard dropped, which the kernel counts by
// address alone) as the address.
func TestRecordOfDest(t *testing.T) {
	a := netip.MustParseAddr("203.0.113.7")
	for _, tc := range []struct {
		name string
		rec  egress.Record
		want string
	}{
		{"connection", egress.Record{Type: egress.RecordConn, Proto: "tcp", Dest: netip.AddrPortFrom(a, 443)}, "203.0.113.7:443"},
		{"allowed flow", egress.Record{Type: egress.RecordFlow, Proto: "udp", Dest: netip.AddrPortFrom(a, 53)}, "203.0.113.7:53"},
		{"refused flow", egress.Record{Type: egress.RecordFlow, Verdict: egress.VerdictRefused, Reason: egress.ReasonAddress,
			Dest: netip.AddrPortFrom(a, 0)}, "203.0.113.7"},
		{"dns", egress.Record{Type: egress.RecordDNS}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := recordOf(tc.rec).Dest; got != tc.want {
				t.Errorf("dest %q, want %q", got, tc.want)
			}
		})
	}
}
