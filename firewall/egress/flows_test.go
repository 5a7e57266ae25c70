package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// Addresses of the flow tests: zone a (vneta, 10.10.1.0/24, sandbox
// sb-a) with guest 101, zone b (vnetb, sandbox sb-b) with guest 102.
var (
	guestA   = netip.MustParseAddr("10.10.1.100")
	guestA2  = netip.MustParseAddr("10.10.1.101")
	guestB   = netip.MustParseAddr("10.10.2.100")
	guestX   = netip.MustParseAddr("10.99.0.5") // a guest of no zone's bridge
	gatewayA = netip.MustParseAddr("10.10.1.1")
	inet     = netip.MustParseAddr("203.0.113.10")
)

// flowBed is a Flows over a fake guard's registry with zones a and b.
type flowBed struct {
	reg *Registry
	log *Log
	f   *Flows
	at  time.Time
}

func newFlowBed(t testing.TB, maxLive int) *flowBed {
	t.Helper()
	return newFlowBedShare(t, maxLive, maxLive)
}

// newFlowBedShare is newFlowBed with perOwner flows followed at most of
// one owner (FlowConfig.PerOwner).
func newFlowBedShare(t testing.TB, maxLive, perOwner int) *flowBed {
	t.Helper()
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
	log := NewLog(LogConfig{PerOwner: 16})
	reg.OnDrop(func(_, owner string) { log.Forget(owner) })
	b := &flowBed{reg: reg, log: log, at: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	b.set(t, "za", "sb-a", "vneta", "vneta2")
	b.set(t, "zb", "sb-b", "vnetb")
	guests := mapGuests{
		guestA:  {Addr: guestA, VMID: 101, MAC: "bc:24:11:00:00:01"},
		guestA2: {Addr: guestA2, VMID: 103, MAC: "bc:24:11:00:00:03"},
		guestB:  {Addr: guestB, VMID: 102, MAC: "bc:24:11:00:00:02"},
		guestX:  {Addr: guestX, VMID: 104},
	}
	addrs := &PrefixAddrs{List: func() ([]IfPrefix, error) {
		return []IfPrefix{{"vneta", netip.MustParsePrefix("10.10.1.1/24")}, {"vnetb", netip.MustParsePrefix("10.10.2.1/24")},
			{"vneta2", netip.MustParsePrefix("10.10.3.1/24")},
			{"eth0", netip.MustParsePrefix("192.0.2.5/24")}, {"lo", netip.MustParsePrefix("127.0.0.1/8")}}, nil
	}}
	b.f = NewFlows(FlowConfig{DNSPort: 15353, ProxyPort: 15380, MaxLive: maxLive, PerOwner: perOwner}, reg, log, guests, addrs, slog.New(slog.DiscardHandler))
	b.f.now = func() time.Time { return b.at }
	return b
}

func (b *flowBed) set(t testing.TB, zone, owner string, bridges ...string) {
	t.Helper()
	r, err := Compile(Policy{Mode: "open"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.reg.Set(context.Background(), zone, owner, bridges, r); err != nil {
		t.Fatal(err)
	}
}

// ctFlow is a conntrack flow of the tests: id, protocol, original tuple
// and counters.
type ctFlow struct {
	id            uint32
	proto         uint8
	src, dst      netip.Addr
	sport, dport  uint16
	redirectTo    uint16 // destination NAT to this local port
	out, in       conntrack.Counter
	start, finish time.Time // kernel timestamps (zero: off)
	zone          uint16    // conntrack zone
}

func (c ctFlow) flow() *conntrack.Flow {
	f := conntrack.NewFlow(c.proto, conntrack.StatusConfirmed, c.src, c.dst, c.sport, c.dport, 0, 0)
	f.ID, f.Zone = c.id, c.zone
	if c.redirectTo != 0 {
		f.Status |= conntrack.StatusDstNAT
		f.TupleReply.IP.SourceAddress = gatewayA
		f.TupleReply.Proto.SourcePort = c.redirectTo
	}
	f.CountersOrig, f.CountersReply = c.out, c.in
	f.CountersReply.Direction = true
	f.Timestamp = conntrack.Timestamp{Start: c.start, Stop: c.finish}
	return &f
}

func newEv(c ctFlow) conntrack.Event {
	return conntrack.Event{Type: conntrack.EventNew, Flow: c.flow()}
}

func destroyEv(c ctFlow) conntrack.Event {
	return conntrack.Event{Type: conntrack.EventDestroy, Flow: c.flow()}
}

func tcpOut(id uint32, src netip.Addr) ctFlow {
	return ctFlow{id: id, proto: unix.IPPROTO_TCP, src: src, dst: inet, sport: 40000 + uint16(id), dport: 80,
		out: conntrack.Counter{Packets: 12, Bytes: 100640}, in: conntrack.Counter{Packets: 9, Bytes: 2500}}
}

// TestFlowsRecord: a guest's flow leaving its zone is recorded in its
// sandbox's ring with conntrack's counters, once; everything that did not
// leave a zone, or is in the record already (a redirect to the daemon's
// resolver or proxy), is skipped and counted.
func TestFlowsRecord(t *testing.T) {
	udp := ctFlow{id: 7, proto: unix.IPPROTO_UDP, src: guestB, dst: inet, sport: 5353, dport: 53,
		out: conntrack.Counter{Packets: 1, Bytes: 63}, in: conntrack.Counter{Packets: 1, Bytes: 79}}
	withSrc := func(c ctFlow, src netip.Addr) ctFlow { c.src = src; return c }
	withDst := func(c ctFlow, dst netip.Addr, port uint16) ctFlow { c.dst, c.dport = dst, port; return c }
	redirected := func(c ctFlow, port uint16) ctFlow { c.redirectTo = port; return c }
	inZone := func(c ctFlow, zone uint16) ctFlow { c.zone = zone; return c }
	icmp := tcpOut(9, guestA)
	icmp.proto = unix.IPPROTO_ICMP
	cases := []struct {
		name string
		flow ctFlow
		// owner whose ring has the record ("": none has)
		owner string
		want  Record
		stats FlowStats
	}{
		{name: "tcp out", flow: tcpOut(1, guestA), owner: "sb-a",
			want: Record{Type: RecordFlow, Verdict: VerdictAllowed, Proto: "tcp", Dest: netip.AddrPortFrom(inet, 80),
				Guest:    Guest{Addr: guestA, VMID: 101, MAC: "bc:24:11:00:00:01"},
				BytesOut: 100640, BytesIn: 2500, PacketsOut: 12, PacketsIn: 9, Duration: 3 * time.Second},
			stats: FlowStats{Recorded: 1}},
		{name: "udp out of the other zone", flow: udp, owner: "sb-b",
			want: Record{Type: RecordFlow, Verdict: VerdictAllowed, Proto: "udp", Dest: netip.AddrPortFrom(inet, 53),
				Guest:    Guest{Addr: guestB, VMID: 102, MAC: "bc:24:11:00:00:02"},
				BytesOut: 63, BytesIn: 79, PacketsOut: 1, PacketsIn: 1, Duration: 3 * time.Second},
			stats: FlowStats{Recorded: 1}},
		{name: "dns redirected to the resolver: its dns record", flow: redirected(withDst(udp, inet, 53), 15353), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "http redirected to the proxy: its conn record", flow: redirected(tcpOut(2, guestA), 15380), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "dnat to another port is a flow", flow: redirected(tcpOut(3, guestA), 8080), owner: "sb-a",
			want: Record{Type: RecordFlow, Verdict: VerdictAllowed, Proto: "tcp", Dest: netip.AddrPortFrom(inet, 80),
				Guest:    Guest{Addr: guestA, VMID: 101, MAC: "bc:24:11:00:00:01"},
				BytesOut: 100640, BytesIn: 2500, PacketsOut: 12, PacketsIn: 9, Duration: 3 * time.Second},
			stats: FlowStats{Recorded: 1}},
		{name: "to the zone's dnsmasq on the node", flow: withDst(udp, gatewayA, 53), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "within its zone", flow: withDst(tcpOut(4, guestA), guestA2, 22), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "to its sandbox's other network", flow: withDst(tcpOut(4, guestA), netip.MustParseAddr("10.10.3.100"), 22), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "to another sandbox's network", flow: withDst(tcpOut(4, guestA), guestB, 22), owner: "sb-a",
			want: Record{Type: RecordFlow, Verdict: VerdictAllowed, Proto: "tcp", Dest: netip.AddrPortFrom(guestB, 22),
				Guest:    Guest{Addr: guestA, VMID: 101, MAC: "bc:24:11:00:00:01"},
				BytesOut: 100640, BytesIn: 2500, PacketsOut: 12, PacketsIn: 9, Duration: 3 * time.Second},
			stats: FlowStats{Recorded: 1}},
		{name: "not a guest's address", flow: withSrc(tcpOut(5, guestA), netip.MustParseAddr("10.10.1.250")), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "the node's own", flow: withSrc(tcpOut(6, guestA), netip.MustParseAddr("192.0.2.5")), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "icmp", flow: icmp, stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "broadcast", flow: withDst(udp, netip.MustParseAddr("255.255.255.255"), 67), stats: FlowStats{Skipped: 1, Unmatched: 1}},
		{name: "guest of no zone's bridge", flow: tcpOut(8, guestX), stats: FlowStats{Unattributed: 1, Unmatched: 1}},
		// a NIC with Proxmox's firewall on: the fwbr pass's entry (zone
		// 1, the guard's and SDN's) is the vnet pass's flow once more
		{name: "firewall bridge pass", flow: inZone(tcpOut(10, guestA), firewall.FirewallBridgeCTZone), stats: FlowStats{Skipped: 1, Unmatched: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newFlowBed(t, 0)
			b.f.Handle(newEv(tc.flow))
			b.at = b.at.Add(3 * time.Second)
			b.f.Handle(destroyEv(tc.flow))
			for _, owner := range []string{"sb-a", "sb-b"} {
				got := b.log.Read(owner, LogQuery{}).Records
				if owner != tc.owner {
					if len(got) != 0 {
						t.Errorf("%s's record: %+v", owner, got)
					}
					continue
				}
				want := tc.want
				want.Seq, want.Time = 1, b.at.Add(-3*time.Second)
				if len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(want) {
					t.Errorf("%s's record:\n got %+v\nwant %+v", owner, got, want)
				}
			}
			if st := b.f.Stats(); st != tc.stats {
				t.Errorf("stats %+v, want %+v", st, tc.stats)
			}
			if b.f.Live() != 0 {
				t.Errorf("%d flows still followed", b.f.Live())
			}
		})
	}
}

// TestFlowsInstance: a flow is recorded in the instance of its sandbox
// it began in; a sandbox deleted, or handed to a new tenant, before the
// flow ends has it recorded nowhere (not in the new instance either).
// The kernel's timestamps, when on, give the start and duration.
func TestFlowsInstance(t *testing.T) {
	cases := []struct {
		name    string
		between func(t *testing.T, b *flowBed)
		want    int // records of sb-a after the flow ends
	}{
		{name: "same instance", between: func(*testing.T, *flowBed) {}, want: 1},
		{name: "policy changed: same instance", between: func(t *testing.T, b *flowBed) { b.set(t, "za", "sb-a", "vneta") }, want: 1},
		{name: "deleted", between: func(t *testing.T, b *flowBed) {
			if err := b.reg.Remove(context.Background(), "za"); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "deleted and made again", between: func(t *testing.T, b *flowBed) {
			if err := b.reg.Remove(context.Background(), "za"); err != nil {
				t.Fatal(err)
			}
			b.set(t, "za", "sb-a", "vneta", "vneta2")
		}},
		{name: "handed to a new tenant", between: func(t *testing.T, b *flowBed) {
			r, _ := Compile(Policy{Mode: "open"})
			if err := b.reg.Begin(context.Background(), "za", "sb-a", []string{"vneta"}, r); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newFlowBed(t, 0)
			fl := tcpOut(1, guestA)
			fl.start = b.at.Add(-time.Second)
			b.f.Handle(newEv(fl))
			tc.between(t, b)
			fl.finish = b.at.Add(time.Minute)
			b.f.Handle(destroyEv(fl))
			got := b.log.Read("sb-a", LogQuery{Type: RecordFlow}).Records
			if len(got) != tc.want {
				t.Fatalf("records %+v, want %d", got, tc.want)
			}
			if tc.want > 0 && (!got[0].Time.Equal(fl.start) || got[0].Duration != 61*time.Second) {
				t.Errorf("time %v duration %v, want the kernel's %v and 61s", got[0].Time, got[0].Duration, fl.start)
			}
			if n := b.log.Held(); n != tc.want {
				t.Errorf("the node holds %d records", n)
			}
		})
	}
}

// TestFlowsBounds: past MaxLive a new flow is not followed (counted), an
// end with another tuple under a followed id is not its end, and a
// resync counts the followed flows gone from the table as lost and
// follows the new ones.
func TestFlowsBounds(t *testing.T) {
	b := newFlowBed(t, 2)
	for id := uint32(1); id <= 3; id++ {
		b.f.Handle(newEv(tcpOut(id, guestA)))
	}
	if st := b.f.Stats(); st.Untracked != 1 || b.f.Live() != 2 {
		t.Fatalf("stats %+v, live %d: want one untracked, two followed", st, b.f.Live())
	}
	other := tcpOut(1, guestA)
	other.dport = 443
	b.f.Handle(destroyEv(other))
	if st := b.f.Stats(); st.Unmatched != 1 || b.f.Live() != 2 {
		t.Fatalf("stats %+v, live %d: an end of another tuple ended a flow", st, b.f.Live())
	}
	// the table holds flow 2 and a new flow 4 (flow 1 ended unseen)
	b.f.Resync([]conntrack.Flow{*tcpOut(2, guestA).flow(), *tcpOut(4, guestA).flow()})
	if st := b.f.Stats(); st.Lost != 1 || b.f.Live() != 2 {
		t.Fatalf("stats %+v, live %d: want flow 1 lost, 2 and 4 followed", st, b.f.Live())
	}
	b.f.Handle(destroyEv(tcpOut(4, guestA)))
	if got := b.log.Read("sb-a", LogQuery{}).Records; len(got) != 1 || got[0].Dest.Port() != 80 {
		t.Errorf("records %+v: want flow 4's", got)
	}
	want := `
# HELP pve_inspect_egress_flow_events_total Conntrack events of guest flows by what the egress record did with them.
# TYPE pve_inspect_egress_flow_events_total counter
pve_inspect_egress_flow_events_total{result="bad"} 0
pve_inspect_egress_flow_events_total{result="lost"} 1
pve_inspect_egress_flow_events_total{result="over_share"} 0
pve_inspect_egress_flow_events_total{result="recorded"} 1
pve_inspect_egress_flow_events_total{result="skipped"} 0
pve_inspect_egress_flow_events_total{result="unattributed"} 0
pve_inspect_egress_flow_events_total{result="unmatched"} 1
pve_inspect_egress_flow_events_total{result="untracked"} 1
# HELP pve_inspect_egress_flow_overruns_total Overruns (ENOBUFS) of the conntrack event socket: events the kernel dropped before the daemon read them.
# TYPE pve_inspect_egress_flow_overruns_total counter
pve_inspect_egress_flow_overruns_total 0
`
	if err := testutil.CollectAndCompare(b.f.Collector(), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestPrefixAddrs: the longest prefix names the bridge; the node's own
// addresses are local; a failed read keeps the last good list.
func TestPrefixAddrs(t *testing.T) {
	fail := false
	p := &PrefixAddrs{List: func() ([]IfPrefix, error) {
		if fail {
			return nil, fmt.Errorf("netlink down")
		}
		return []IfPrefix{{"vmbr0", netip.MustParsePrefix("10.0.0.2/8")}, {"vneta", netip.MustParsePrefix("10.10.1.1/24")},
			{"host", netip.MustParsePrefix("10.10.1.9/32")}}, nil
	}}
	cases := []struct {
		addr   string
		bridge string
		local  bool
	}{
		{"10.10.1.100", "vneta", false},
		{"10.10.1.1", "vneta", true},
		{"10.10.1.9", "vneta", true},
		{"10.20.0.1", "vmbr0", false},
		{"203.0.113.10", "", false},
	}
	for _, f := range []bool{false, true} {
		fail = f
		p.at = time.Time{} // read again
		for _, tc := range cases {
			a := netip.MustParseAddr(tc.addr)
			got, _ := p.BridgeOf(a)
			if got != tc.bridge || p.IsLocal(a) != tc.local {
				t.Errorf("failing read %v: %s: bridge %q local %v, want %q %v", f, tc.addr, got, p.IsLocal(a), tc.bridge, tc.local)
			}
		}
	}
}

// Attribute and message numbers of ctnetlink
// (linux/netfilter/nfnetlink_conntrack.h, nfnetlink_compat.h).
const (
	ctaTupleOrig, ctaTupleReply, ctaStatus        = 1, 2, 3
	ctaCountersOrig, ctaCountersReply, ctaID      = 9, 10, 12
	ctaTupleIP, ctaTupleProto                     = 1, 2
	ctaIPv4Src, ctaIPv4Dst                        = 1, 2
	ctaProtoNum, ctaProtoSrcPort, ctaProtoDstPort = 1, 2, 3
	ctaCountersPackets, ctaCountersBytes          = 1, 2
	ipctnlMsgCtNew, ipctnlMsgCtDelete             = 0, 2
	nfprotoIPv4                                   = 2
)

// encodeEvent is ev as the kernel sends it (the attributes Flows reads).
func encodeEvent(t testing.TB, typ conntrack.Event, c ctFlow) netlink.Message {
	t.Helper()
	tuple := func(at uint16, src, dst netip.Addr, sport, dport uint16) netfilter.Attribute {
		return netfilter.Attribute{Type: at, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaTupleIP, Nested: true, Children: []netfilter.Attribute{
				{Type: ctaIPv4Src, Data: src.AsSlice()}, {Type: ctaIPv4Dst, Data: dst.AsSlice()}}},
			{Type: ctaTupleProto, Nested: true, Children: []netfilter.Attribute{
				{Type: ctaProtoNum, Data: []byte{c.proto}},
				{Type: ctaProtoSrcPort, Data: netfilter.Uint16Bytes(sport)}, {Type: ctaProtoDstPort, Data: netfilter.Uint16Bytes(dport)}}},
		}}
	}
	counters := func(at uint16, ctr conntrack.Counter) netfilter.Attribute {
		return netfilter.Attribute{Type: at, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaCountersPackets, Data: netfilter.Uint64Bytes(ctr.Packets)}, {Type: ctaCountersBytes, Data: netfilter.Uint64Bytes(ctr.Bytes)}}}
	}
	f := c.flow()
	attrs := []netfilter.Attribute{
		tuple(ctaTupleOrig, c.src, c.dst, c.sport, c.dport),
		tuple(ctaTupleReply, f.TupleReply.IP.SourceAddress, f.TupleReply.IP.DestinationAddress, f.TupleReply.Proto.SourcePort, f.TupleReply.Proto.DestinationPort),
		{Type: ctaStatus, Data: netfilter.Uint32Bytes(uint32(f.Status))},
		{Type: ctaID, Data: netfilter.Uint32Bytes(c.id)},
	}
	h := netfilter.Header{SubsystemID: netfilter.NFSubsysCTNetlink, MessageType: ipctnlMsgCtNew,
		Flags: netlink.Create | netlink.Excl, Family: nfprotoIPv4}
	if typ.Type == conntrack.EventDestroy {
		h.MessageType, h.Flags = ipctnlMsgCtDelete, 0
		attrs = append(attrs, counters(ctaCountersOrig, c.out), counters(ctaCountersReply, c.in))
	}
	m, err := netfilter.MarshalNetlink(h, attrs)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// decodeHandle is what Run does with one message.
func decodeHandle(f *Flows, m netlink.Message) {
	var ev conntrack.Event
	if err := ev.Unmarshal(m); err != nil {
		f.bad.Add(1)
		return
	}
	f.Handle(ev)
}

// TestFlowsDecode: the events as the kernel encodes them are recorded
// as the decoded ones are.
func TestFlowsDecode(t *testing.T) {
	b := newFlowBed(t, 0)
	fl := tcpOut(1, guestA)
	decodeHandle(b.f, encodeEvent(t, conntrack.Event{Type: conntrack.EventNew}, fl))
	decodeHandle(b.f, encodeEvent(t, conntrack.Event{Type: conntrack.EventDestroy}, fl))
	got := b.log.Read("sb-a", LogQuery{}).Records
	if len(got) != 1 || got[0].BytesOut != 100640 || got[0].PacketsIn != 9 || got[0].Dest != netip.AddrPortFrom(inet, 80) {
		t.Fatalf("records %+v, stats %+v", got, b.f.Stats())
	}
}

// FuzzFlowEvent: no message, however made, panics the decoder and
// Flows, or leaves more flows followed than MaxLive.
func FuzzFlowEvent(f *testing.F) {
	b := newFlowBed(f, 4)
	fl := tcpOut(1, guestA)
	for _, typ := range []conntrack.Event{{Type: conntrack.EventNew}, {Type: conntrack.EventDestroy}} {
		m := encodeEvent(f, typ, fl)
		f.Add(uint16(m.Header.Type), uint16(m.Header.Flags), m.Data)
	}
	f.Fuzz(func(t *testing.T, typ, flags uint16, data []byte) {
		m := netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.HeaderFlags(flags)}, Data: data}
		decodeHandle(b.f, m)
		if b.f.Live() > 4 {
			t.Fatalf("%d flows followed, bound 4", b.f.Live())
		}
	})
}

// BenchmarkFlowEvents is the cost of one flow: its NEW and DESTROY
// events decoded as the kernel sends them and handled into a ring.
func BenchmarkFlowEvents(b *testing.B) {
	fb := newFlowBed(b, 0)
	const n = 1024
	msgs := make([][2]netlink.Message, n)
	for i := range msgs {
		fl := tcpOut(uint32(i+1), guestA)
		msgs[i] = [2]netlink.Message{encodeEvent(b, conntrack.Event{Type: conntrack.EventNew}, fl),
			encodeEvent(b, conntrack.Event{Type: conntrack.EventDestroy}, fl)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		m := msgs[i%n]
		decodeHandle(fb.f, m[0])
		decodeHandle(fb.f, m[1])
	}
	b.StopTimer()
	if st := fb.f.Stats(); st.Recorded != uint64(b.N) {
		b.Fatalf("recorded %d of %d: %+v", st.Recorded, b.N, st)
	}
}
