package egress

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLogCounts: a ring counts its records by type and verdict, the bytes
// they carried (not those of a refused flow: the guard dropped them),
// and what it made and dropped (a dropped record is still counted); a
// new instance of the owner has another Gen and starts at zero.
func TestLogCounts(t *testing.T) {
	l := NewLog(LogConfig{PerOwner: 2, Node: 10})
	if _, ok := l.Counts("sb-a"); ok {
		t.Fatal("counts of an owner with no ring")
	}
	r := l.Open("sb-a")
	for _, rec := range []Record{
		{Type: RecordDNS, Verdict: VerdictAnswered},
		{Type: RecordDNS, Verdict: VerdictRefused, Reason: ReasonName},
		{Type: RecordDNS, Verdict: VerdictFailed, Reason: ReasonUpstream},
		{Type: RecordConn, Verdict: VerdictAllowed, BytesOut: 100, BytesIn: 2000},
		{Type: RecordConn, Verdict: VerdictRefused, Reason: ReasonSNI},
		{Type: RecordConn, Verdict: VerdictFailed, Reason: ReasonConnect, BytesOut: 5},
		{Type: RecordFlow, Verdict: VerdictAllowed, BytesOut: 58, BytesIn: 86, PacketsOut: 1, PacketsIn: 1},
		// packets the guard dropped (KernelDrops): a record, no flow, no byte out
		{Type: RecordFlow, Verdict: VerdictRefused, Reason: ReasonAddress, BytesOut: 120, PacketsOut: 2},
	} {
		r.Add(rec)
	}
	got, ok := l.Counts("sb-a")
	want := Counts{DNSAnswered: 1, DNSRefused: 1, DNSFailed: 1, ConnAllowed: 1, ConnRefused: 1, ConnFailed: 1, Flows: 1,
		BytesOut: 163, BytesIn: 2086, Records: 8, Dropped: 6}
	if !ok || got.Now != want || got.Base != (Counts{}) {
		t.Fatalf("counts %+v %v, want %+v", got, ok, want)
	}
	l.Forget("sb-a")
	if _, ok := l.Counts("sb-a"); ok {
		t.Fatal("counts of a forgotten owner")
	}
	l.Open("sb-a").Add(Record{Type: RecordDNS, Verdict: VerdictAnswered})
	again, _ := l.Counts("sb-a")
	if again.Gen == got.Gen || again.Now != (Counts{DNSAnswered: 1, Records: 1}) {
		t.Errorf("new instance: %+v (old gen %d)", again, got.Gen)
	}
}

// TestLogCollector: one series per owner and counter, labelled sandbox
// (and direction for bytes), gone with the owner's ring; the names pass
// promlint.
func TestLogCollector(t *testing.T) {
	l := NewLog(LogConfig{PerOwner: 4, Node: 16})
	l.Open("sb-a").Add(Record{Type: RecordConn, Verdict: VerdictAllowed, BytesOut: 7, BytesIn: 9})
	l.Open("sb-b").Add(Record{Type: RecordDNS, Verdict: VerdictAnswered})
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(l.Collector()); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP pve_inspect_egress_record_bytes_total Bytes of the sandbox's recorded connections (payload relayed by the proxy) and flows (IP bytes, headers included, as conntrack counts them) (sandbox: zone:<id> for zones the daemon did not create), by direction (out: guest to destination; in: back), since its instance began; kept across daemon restarts with the record.
# TYPE pve_inspect_egress_record_bytes_total counter
pve_inspect_egress_record_bytes_total{direction="in",sandbox="sb-a"} 9
pve_inspect_egress_record_bytes_total{direction="in",sandbox="sb-b"} 0
pve_inspect_egress_record_bytes_total{direction="out",sandbox="sb-a"} 7
pve_inspect_egress_record_bytes_total{direction="out",sandbox="sb-b"} 0
# HELP pve_inspect_egress_records_dropped_total Records of the sandbox's egress record dropped (its ring full, or the node's bound reached), since its instance began.
# TYPE pve_inspect_egress_records_dropped_total counter
pve_inspect_egress_records_dropped_total{sandbox="sb-a"} 0
pve_inspect_egress_records_dropped_total{sandbox="sb-b"} 0
# HELP pve_inspect_egress_records_total Records of the sandbox's egress record made (DNS questions, proxied connections and kernel flows), since its instance began.
# TYPE pve_inspect_egress_records_total counter
pve_inspect_egress_records_total{sandbox="sb-a"} 1
pve_inspect_egress_records_total{sandbox="sb-b"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	l.Forget("sb-a")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 4 {
		t.Errorf("%d series after sb-a is forgotten (%v), want sb-b's 4", n, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}
