package daemon

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEgressTakeLog: the daemon's egress part hands a sandbox's whole
// record over as the API shows it (every field recordOf converts), oldest
// first, with its dropped count and newest seq; the record leaves the
// node's at once and its room is given back at the release; a sandbox
// that recorded nothing hands over an empty record.
func TestEgressTakeLog(t *testing.T) {
	cases := []struct {
		name    string
		adds    int // records of the sandbox (ring of 2)
		want    []uint64
		dropped uint64
	}{
		{name: "nothing recorded", adds: 0},
		{name: "ring turned over", adds: 3, want: []uint64{2, 3}, dropped: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			log := egress.NewLog(egress.LogConfig{PerOwner: 2, Node: 8})
			e := &Egress{Record: log}
			for range tc.adds {
				log.Open("sbtake01").Add(egress.Record{Type: egress.RecordConn, Verdict: egress.VerdictAllowed, Proto: "tcp", Name: "example.org", Check: "sni",
					Dest: netip.MustParseAddrPort("192.0.2.1:443"), Guest: egress.Guest{VMID: 101, Addr: netip.MustParseAddr("10.0.0.2")}, BytesOut: 300, BytesIn: 4000})
			}
			h := e.TakeLog("sbtake01")
			var got []apitype.EgressRecord
			if err := h.Each(func(r apitype.EgressRecord) error { got = append(got, r); return nil }); err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for _, r := range got {
				seqs = append(seqs, r.Seq)
				if r.Dest != "192.0.2.1:443" || r.Source != "10.0.0.2" || r.VMID != 101 || r.BytesIn != 4000 || r.Check != "sni" || r.Time.IsZero() {
					t.Errorf("record %+v: not as the API shows it", r)
				}
			}
			var next uint64
			if len(tc.want) > 0 {
				next = tc.want[len(tc.want)-1]
			}
			if !slices.Equal(seqs, tc.want) || h.Len() != len(tc.want) || h.Next() != next || h.Dropped() != tc.dropped {
				t.Errorf("handed over seqs %v (len %d, next %d, dropped %d), want %v, dropped %d", seqs, h.Len(), h.Next(), h.Dropped(), tc.want, tc.dropped)
			}
			if l := e.Log("sbtake01", sandbox.EgressLogFilter{}); len(l.Records) != 0 {
				t.Errorf("read after the take: %+v", l)
			}
			if n := log.Held(); n != len(tc.want) {
				t.Errorf("held %d before the release, want %d", n, len(tc.want))
			}
			h.Release()
			if n := log.Held(); n != 0 {
				t.Errorf("held %d after the release", n)
			}
		})
	}
}

// endingEgress is an OpenEgress whose sandbox has one connection or flow
// still open: EndOf ends it, recording it in the sandbox's ring.
type endingEgress struct {
	log   *egress.Log
	name  string
	ended []string
}

func (o *endingEgress) EndOf(_ context.Context, sb string) error {
	o.ended = append(o.ended, sb)
	o.log.Open(sb).Add(egress.Record{Type: egress.RecordFlow, Verdict: egress.VerdictAllowed, Proto: "tcp", Name: o.name, BytesOut: 7})
	return nil
}

// TestEgressTakeLogEndsWhatIsOpen: a connection or flow is recorded only
// when it ends, so what a sandbox's guest left open when its record was
// handed over at its delete was recorded after the take, nowhere, and a
// guest kept what it sent out of the record by not closing (review16).
// TakeLog ends the sandbox's open egress first (the proxy's connections,
// the kernel's flows), so the hand-over holds it.
func TestEgressTakeLogEndsWhatIsOpen(t *testing.T) {
	log := egress.NewLog(egress.LogConfig{PerOwner: 8, Node: 16})
	proxy, flows := &endingEgress{log: log, name: "conn"}, &endingEgress{log: log, name: "flow"}
	e := &Egress{Record: log, Open: []OpenEgress{proxy, flows}}
	log.Open("sbtake02").Add(egress.Record{Type: egress.RecordDNS, Verdict: egress.VerdictAnswered, Name: "before.example"})
	h := e.TakeLog("sbtake02")
	defer h.Release()
	var names []string
	if err := h.Each(func(r apitype.EgressRecord) error { names = append(names, r.Name); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"before.example", "conn", "flow"}) {
		t.Errorf("handed over %v, want the record and what was open, ended before the take", names)
	}
	if !slices.Equal(proxy.ended, []string{"sbtake02"}) || !slices.Equal(flows.ended, []string{"sbtake02"}) {
		t.Errorf("ended %v and %v, want the sandbox's", proxy.ended, flows.ended)
	}
}
