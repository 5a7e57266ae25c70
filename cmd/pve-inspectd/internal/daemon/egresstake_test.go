package daemon

import (
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
