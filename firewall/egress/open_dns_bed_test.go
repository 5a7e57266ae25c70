package egress

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// exchange asks server from zone's guest one question (over TCP when
// tcp), retried twice on a timeout like resolve.
func (s *stack) exchange(zone, server, name string, qtype uint16, tcp bool) (*dns.Msg, error) {
	var resp *dns.Msg
	var err error
	for range 3 {
		err = s.b.Do(s.guests[zone].NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), qtype)
			c := &dns.Client{Timeout: 3 * time.Second}
			if tcp {
				c.Net = "tcp"
			}
			var err error
			resp, _, err = c.Exchange(m, server)
			return err
		})
		if !isTimeout(err) {
			break
		}
	}
	return resp, err
}

// TestEgressOpenDNSRecordOnBed is the record's "each DNS question, in
// open as well": the guest of a sandbox in open mode asks its zone's
// resolver (its gateway, where the zone's dnsmasq listens) as a guest
// does, over UDP and TCP, names of every kind (A, AAAA and TXT of an
// internet name, its own zone-local name, a name that does not exist);
// each answer is the one the zone's dnsmasq gives (every type, not just
// A: open mode forwards unchanged), each question is in the sandbox's
// record with its type, rcode and answers, and nothing is learned into
// the guard's sets. A question to another server is not redirected (it
// is a flow, TestEgressFlowsOnBed), and a zone the daemon did not create
// (under the node default) keeps its DNS path and has no record.
func TestEgressOpenDNSRecordOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	elog := NewLog(LogConfig{PerOwner: 64})
	s := newRecordingStack(t, ctx, elog)
	s.set(t, ctx, "zonec", Policy{Mode: "open"})
	gw := s.gw["zonec"] + ":53"
	guest := s.guests["zonec"]
	self := fmt.Sprintf("vm%d", guest.VMID) // its DHCP host name, held by the zone's dnsmasq

	cases := []struct {
		name    string
		qtype   uint16
		tcp     bool
		rcode   int
		answer  string // the answer's first record's data; "" for none
		reason  string
		addrs   []netip.Addr // the record's answer addresses
		counted bool         // whether a record is expected
	}{
		{name: testvm.InternetName, qtype: dns.TypeA, rcode: dns.RcodeSuccess, answer: testvm.InternetAddr,
			addrs: []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)}},
		{name: testvm.InternetName, qtype: dns.TypeAAAA, rcode: dns.RcodeSuccess, answer: testvm.InternetAddr6},
		{name: "x." + testvm.InternetName, qtype: dns.TypeTXT, rcode: dns.RcodeSuccess, answer: `"` + testvm.InternetTXT + `"`},
		{name: testvm.InternetName, qtype: dns.TypeA, tcp: true, rcode: dns.RcodeSuccess, answer: testvm.InternetAddr,
			addrs: []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)}},
		{name: self, qtype: dns.TypeA, rcode: dns.RcodeSuccess, answer: guest.IPv4().String(), reason: ReasonZone,
			addrs: []netip.Addr{guest.IPv4()}},
		{name: "nothing-" + randLabel(t) + ".test", qtype: dns.TypeA, rcode: dns.RcodeNameError},
	}
	for _, tc := range cases {
		resp, err := s.exchange("zonec", gw, tc.name, tc.qtype, tc.tcp)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.name, dns.TypeToString[tc.qtype], err)
		}
		got := ""
		if len(resp.Answer) > 0 {
			rr := resp.Answer[0]
			got = strings.TrimPrefix(rr.String(), rr.Header().String())
		}
		if resp.Rcode != tc.rcode || got != tc.answer {
			t.Errorf("%s %s (tcp %v): %s %q, want %s %q", tc.name, dns.TypeToString[tc.qtype], tc.tcp,
				dns.RcodeToString[resp.Rcode], got, dns.RcodeToString[tc.rcode], tc.answer)
		}
	}

	recs := elog.Read("sb-zonec", LogQuery{Type: RecordDNS}).Records
	if len(recs) != len(cases) {
		t.Fatalf("%d DNS records, want %d: %+v", len(recs), len(cases), recs)
	}
	for i, tc := range cases {
		r := recs[i]
		if r.Name != strings.ToLower(tc.name) || r.QType != dns.TypeToString[tc.qtype] || r.Verdict != VerdictAnswered ||
			r.Reason != tc.reason || r.Rcode != dns.RcodeToString[tc.rcode] || !slices.Equal(r.Answers, tc.addrs) ||
			r.Guest.VMID != guest.VMID || r.Guest.Addr != guest.IPv4() {
			t.Errorf("record %d: %+v, want %s %s answered (%q) %s %v from VM %d", i, r, tc.name, dns.TypeToString[tc.qtype],
				tc.reason, dns.RcodeToString[tc.rcode], tc.addrs, guest.VMID)
		}
	}
	if m := s.learnedMembers(t); strings.Contains(m, "elements") {
		t.Errorf("an open sandbox's answers were learned:\n%s", m)
	}

	// another server: reached as the guest addressed it, no DNS record
	resp, err := s.exchange("zonec", testvm.InternetAddr+":53", testvm.InternetName, dns.TypeTXT, false)
	if err != nil || len(resp.Answer) != 1 || !resp.Authoritative {
		t.Errorf("the internet host's resolver from the open guest: %v, %v; want its own authoritative answer", resp, err)
	}
	if n := len(elog.Read("sb-zonec", LogQuery{Type: RecordDNS}).Records); n != len(cases) {
		t.Errorf("%d DNS records after a question to another server, want %d (it is a flow)", n, len(cases))
	}

	// a zone under the node default (no policy of its own: a reference
	// plugin's) asks its dnsmasq directly, and nothing is recorded
	if got, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", false); err != nil || !slices.Equal(got, []string{testvm.InternetAddr}) {
		t.Errorf("the default zone's DNS: %v, %v", got, err)
	}
	zone, _ := s.g.ZoneOfBridge(s.bridge["zoneb"])
	for _, owner := range []string{DefaultOwnerOf(zone, s.bridge["zoneb"]), DefaultOwnerOf("", s.bridge["zoneb"])} {
		if n := len(elog.Read(owner, LogQuery{}).Records); n != 0 {
			t.Errorf("%s has %d records", owner, n)
		}
	}
}
