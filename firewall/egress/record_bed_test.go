package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// newRecordingStack is a stack (node default open) whose resolver and
// proxy write into elog, naming each record's VM by the guard's port map.
func newRecordingStack(t *testing.T, ctx context.Context, elog *Log) *stack {
	t.Helper()
	var s *stack
	guests := &PortGuests{Ports: func() []firewall.Port { return s.g.Ports() }}
	s = newStackWith(t, ctx, Policy{Mode: "open"}, stackConfig{
		resolver: ResolverConfig{Log: elog, Guests: guests}, proxy: ProxyConfig{Log: elog, Guests: guests}})
	return s
}

// eachMode gives each zone a mode of its own: zonea an allowlist of the
// internet host's name, zoneb none, zonec open.
func (s *stack) eachMode(t *testing.T, ctx context.Context) {
	t.Helper()
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "none"})
	s.set(t, ctx, "zonec", Policy{Mode: "open"})
}

// guestIPOut is the IP packets the guest of zone has sent so far (Ip
// OutRequests of its namespace).
func (s *stack) guestIPOut(t *testing.T, zone string) int64 {
	t.Helper()
	var n int64
	if err := s.b.Do(s.guests[zone].NS, func() error {
		// thread-self: the namespace of this (locked) thread, not the process's
		f, err := os.Open("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		defer f.Close()
		var names []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) == 0 || fs[0] != "Ip:" {
				continue
			}
			if names == nil {
				names = fs
				continue
			}
			for i, name := range names {
				if name == "OutRequests" && i < len(fs) {
					n, err = strconv.ParseInt(fs[i], 10, 64)
					return err
				}
			}
		}
		return fmt.Errorf("no Ip OutRequests in snmp: %v", sc.Err())
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// startKernelDrops runs a KernelDrops over the guard's sets into the
// stack's denials and elog, reading every interval, until the test ends;
// the baseline is taken before it returns, so that every packet dropped
// after is counted.
func (s *stack) startKernelDrops(t *testing.T, ctx context.Context, elog *Log, every time.Duration) {
	t.Helper()
	kd := NewKernelDrops(s.g, s.reg, s.den, elog, every, nil)
	if err := kd.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kd.Run(kctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kernel drops: %v", err)
		}
	})
}

// TestEgressNoneRecordOnBed: a guest of a none sandbox asks a name (the
// resolver refuses it, reason mode), opens a TCP connection and sends
// UDP datagrams of a known size to the internet host, all dropped by the
// guard; its sandbox's record lists the question and refused flow
// records for the internet host's address (no port, no VM: the guard's
// set keys by the zone's bridge and the address) whose packets add up to
// what the guest sent there, at least every datagram and one SYN, at most
// every IP packet the guest sent (its namespace's Ip OutRequests), and
// whose IP bytes are the datagrams' and the SYNs' within one packet's
// worth. The other sandboxes' records stay empty.
func TestEgressNoneRecordOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	elog := NewLog(LogConfig{PerOwner: 64})
	s := newRecordingStack(t, ctx, elog)
	s.eachMode(t, ctx)
	s.startKernelDrops(t, ctx, elog, 200*time.Millisecond)
	inet := testvm.InternetAddr

	if got, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", false); err == nil {
		t.Fatalf("none: %s resolved: %v", testvm.InternetName, got)
	}
	before := s.guestIPOut(t, "zoneb")
	// tcp: the SYN and its retransmits, all dropped
	if err := s.b.Do(s.guests["zoneb"].NS, func() error {
		c, err := net.DialTimeout("tcp4", inet+":80", 1500*time.Millisecond)
		if err == nil {
			c.Close()
			return fmt.Errorf("none: connected to %s:80", inet)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// udp: datagrams of a known size, from one socket
	const datagrams, payload = 5, 1200
	if err := s.b.Do(s.guests["zoneb"].NS, func() error {
		c, err := net.Dial("udp4", inet+":9")
		if err != nil {
			return err
		}
		defer c.Close()
		for range datagrams {
			if _, err := c.Write(make([]byte, payload)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	sent := s.guestIPOut(t, "zoneb") - before

	sum := func() (packets, bytes int64, recs []Record) {
		for _, r := range elog.Read("sb-zoneb", LogQuery{Type: RecordFlow}).Records {
			if r.Dest.Addr().String() == inet {
				packets += r.PacketsOut
				bytes += r.BytesOut
			}
			recs = append(recs, r)
		}
		return packets, bytes, recs
	}
	var packets, bytes int64
	var flows []Record
	for range 100 { // read every 200 ms: the drops are in within a read or two
		if packets, bytes, flows = sum(); packets >= sent {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	syns := packets - datagrams
	t.Logf("guest sent %d IP packets; record: %d packets, %d bytes to %s in %d records: %+v", sent, packets, bytes, inet, len(flows), flows)
	if packets < datagrams+1 || packets > sent {
		t.Errorf("refused flows to %s count %d packets; want at least the %d datagrams and a SYN, at most the %d IP packets the guest sent",
			inet, packets, datagrams, sent)
	}
	// 20 bytes of IP and 8 of UDP on each datagram, 20 of IP and 40 of
	// TCP with its options on each SYN
	const onePacket = 1500
	if want := int64(datagrams*(20+8+payload)) + syns*(20+40); bytes < want-onePacket || bytes > want+onePacket {
		t.Errorf("refused flows to %s count %d IP bytes, want %d within one packet's worth", inet, bytes, want)
	}
	for _, r := range flows {
		if r.Verdict != VerdictRefused || r.Reason != ReasonAddress || r.Dest.Port() != 0 || r.Proto != "" ||
			r.Guest != (Guest{}) || r.PacketsOut <= 0 || r.Time.IsZero() {
			t.Errorf("flow record %+v, want refused (address), the address alone, no VM, packets", r)
		}
	}
	dnsRecs := elog.Read("sb-zoneb", LogQuery{Type: RecordDNS}).Records
	if len(dnsRecs) == 0 {
		t.Error("no DNS record of the refused question")
	}
	for _, r := range dnsRecs {
		if r.Name != testvm.InternetName || r.Verdict != VerdictRefused || r.Reason != ReasonMode || r.Guest.VMID != s.guests["zoneb"].VMID {
			t.Errorf("DNS record %+v, want %s refused (mode) from VM %d", r, testvm.InternetName, s.guests["zoneb"].VMID)
		}
	}
	for _, z := range []string{"sb-zonea", "sb-zonec"} {
		if n := len(elog.Read(z, LogQuery{}).Records); n != 0 {
			t.Errorf("%s's record has %d entries", z, n)
		}
	}
}

// TestEgressRecordFloodOnBed: a guest of an open sandbox opens thousands
// of short flows (UDP datagrams from distinct source ports, and TCP
// connections) to the internet host, past both the flows followed at
// once (MaxLive) and its ring; its record stays at its bound with the
// rest counted as dropped, Flows follows no more than MaxLive, and while
// the flood's events come in another sandbox's DNS questions through the
// resolver are answered, its record holding only its own.
func TestEgressRecordFloodOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ring, maxLive = 256, 512
	elog := NewLog(LogConfig{PerOwner: ring})
	s := newRecordingStack(t, ctx, elog)
	s.eachMode(t, ctx)
	s.conntrackAcct(t)
	// one owner floods: its share is the node's (the per-owner share of
	// the followed flows is TestFlowsPerOwnerShare's)
	flows, stopFlows := s.startFlows(t, ctx, elog, FlowConfig{MaxLive: maxLive, PerOwner: maxLive})
	s.startKernelDrops(t, ctx, elog, 200*time.Millisecond)
	inet := testvm.InternetAddr

	// the flood: each datagram from a socket of its own (a flow each),
	// a TCP connection every 100 datagrams, paced (about 650 flows a
	// second, each lasting its 2 s timeout) to stay under the guard's
	// tracked connections per guest (firewall.DefaultConnLimit), past
	// which the guard would drop the TCP connections too
	const datagrams = 3000
	fctx, stopFlood := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var floodErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		floodErr = s.b.Do(s.guests["zonec"].NS, func() error {
			for i := range datagrams {
				if fctx.Err() != nil {
					return fctx.Err()
				}
				c, err := net.Dial("udp4", inet+":9")
				if err != nil {
					return err
				}
				_, err = c.Write([]byte("flood"))
				c.Close()
				if err != nil {
					return err
				}
				if i%100 == 0 {
					if err := getOnce(inet + ":80"); err != nil {
						return fmt.Errorf("tcp connection after %d datagrams: %w", i, err)
					}
					time.Sleep(150 * time.Millisecond)
				}
			}
			return nil
		})
	}()
	defer func() {
		stopFlood()
		wg.Wait()
	}()

	// while it floods, and while its flows' ends come in, zone A's
	// questions are answered and zone C's ring never passes its bound
	asked := 0
	for range 300 {
		if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err != nil || len(got) != 1 || got[0] != inet {
			t.Fatalf("zone A's question %d during the flood: %v, %v", asked+1, got, err)
		}
		asked++
		if n := len(elog.Read("sb-zonec", LogQuery{}).Records); n > ring {
			t.Fatalf("zone C's record holds %d records, past its bound %d", n, ring)
		}
		if c, _ := elog.Counts("sb-zonec"); asked >= 3 && c.Now.Records > 2*ring {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	if floodErr != nil {
		t.Fatalf("flood: %v", floodErr)
	}
	for range 600 { // the flows end as conntrack's timeouts expire them
		if flows.Stats().Recorded >= maxLive {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopFlows()
	st := flows.Stats()
	page, counts := elog.Read("sb-zonec", LogQuery{}), mustCounts(t, elog, "sb-zonec")
	t.Logf("zone A asked %d questions; zone C: %d records held of %d made, %d dropped; flows %+v, %d followed at the end",
		asked, len(page.Records), counts.Now.Records, page.Dropped, st, flows.Live())
	if len(page.Records) != ring || page.Dropped == 0 || page.Dropped != counts.Now.Records-ring {
		t.Errorf("zone C's record: %d held, %d dropped of %d made; want its bound %d held and the rest dropped",
			len(page.Records), page.Dropped, counts.Now.Records, ring)
	}
	if st.Untracked == 0 || st.Recorded < maxLive {
		t.Errorf("flows %+v: want at least MaxLive (%d) recorded and some past it untracked", st, maxLive)
	}
	if n := flows.Live(); n > maxLive {
		t.Errorf("%d flows followed, past MaxLive %d", n, maxLive)
	}
	a := elog.Read("sb-zonea", LogQuery{})
	if len(a.Records) < asked || a.Dropped != 0 {
		t.Errorf("zone A's record: %d records, %d dropped; want its %d questions", len(a.Records), a.Dropped, asked)
	}
	for _, r := range a.Records {
		if r.Type != RecordDNS || r.Name != testvm.InternetName || r.Verdict != VerdictAnswered || r.Guest.VMID != s.guests["zonea"].VMID {
			t.Errorf("zone A's record holds %+v", r)
		}
	}
	if n := len(elog.Read("sb-zoneb", LogQuery{}).Records); n != 0 {
		t.Errorf("zone B's record has %d entries", n)
	}
}

// getOnce fetches / from addr over one TCP connection (made in the
// caller's namespace) and reads the answer to its end.
func getOnce(addr string) error {
	c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: "+testvm.InternetName+"\r\n\r\n"); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, c)
	return err
}

func mustCounts(t *testing.T, l *Log, owner string) LogCounts {
	t.Helper()
	c, ok := l.Counts(owner)
	if !ok {
		t.Fatalf("%s has no record", owner)
	}
	return c
}
