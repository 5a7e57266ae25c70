package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// udpEcho answers every datagram to addr in the bed's uplink namespace
// with itself until the test ends.
func (s *stack) udpEcho(t *testing.T, addr string) {
	t.Helper()
	var pc net.PacketConn
	if err := s.b.Do(s.b.UplinkNS(), func() (err error) {
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
}

// sendUDP sends datagrams of payload bytes to addr from one socket of
// zone's guest and, when echo is set, reads each one back; it returns
// the bytes read back.
func (s *stack) sendUDP(zone, addr string, datagrams, payload int, echo bool) (int64, error) {
	var back int64
	err := s.b.Do(s.guests[zone].NS, func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 65536)
		for range datagrams {
			if _, err := c.Write(make([]byte, payload)); err != nil {
				return err
			}
			if !echo {
				continue
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				return err
			}
			back += int64(n)
		}
		return nil
	})
	return back, err
}

// sendTCP sends requests HTTP requests of exactly size bytes each on
// one connection (pipelined; the Host header first, a pad header making
// up the size, the last asking to close) to addr from zone's guest and
// reads the answers to the end; it returns the bytes read.
func (s *stack) sendTCP(zone, addr string, requests, size int) (int64, error) {
	var req string
	for i := range requests {
		head := "GET / HTTP/1.1\r\nHost: " + testvm.InternetName + "\r\n"
		if i == requests-1 {
			head += "Connection: close\r\n"
		}
		head += "X-Pad: "
		req += head + strings.Repeat("p", size-len(head)-4) + "\r\n\r\n"
	}
	var read int64
	err := s.b.Do(s.guests[zone].NS, func() error {
		c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			return err
		}
		read, err = io.Copy(io.Discard, c)
		return err
	})
	if err == nil && read == 0 {
		err = errors.New("no answer")
	}
	return read, err
}

// TestEgressAllowlistRecordOnBed: a guest of an allowlist sandbox
// resolves an allowed and a denied name, sends UDP datagrams of a known
// size to an address its list does not hold (dropped by the guard), a
// TCP requests of a known size to the allowed name (through the proxy's
// Host check), then, once its list also holds the address as a CIDR,
// UDP datagrams to that address's echo port and TCP requests to it by
// address (the kernel's, past the proxy). Its sandbox's record lists
// each with its verdict: the questions answered and refused (name); the
// first datagrams as a refused flow (address) whose packets are the
// datagrams and whose IP bytes are theirs within one packet's worth; the
// proxied connection (allowed, checked by Host) whose bytes each way are
// what the guest sent and read within one packet's worth; and the two
// kernel flows (allowed, from conntrack's accounting) whose payload each
// way, the headers taken off, is what the guest sent and read within one
// packet's worth. The other sandboxes' records stay empty.
func TestEgressAllowlistRecordOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	elog := NewLog(LogConfig{PerOwner: 64})
	s := newRecordingStack(t, ctx, elog)
	s.eachMode(t, ctx) // zonea: allowlist of the internet host's name
	s.conntrackAcct(t)
	flows, _ := s.startFlows(t, ctx, elog, FlowConfig{})
	s.startKernelDrops(t, ctx, elog, 200*time.Millisecond)
	const echoPort = "7"
	inet := testvm.InternetAddr
	s.udpEcho(t, net.JoinHostPort(inet, echoPort))
	const onePacket = 1500
	within := func(got, want int64) bool { return got >= want-onePacket && got <= want+onePacket }

	// names: one on the list, one not
	if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err != nil || len(got) != 1 || got[0] != inet {
		t.Fatalf("resolve allowed: %v, %v", got, err)
	}
	if _, err := s.resolve("zonea", "evil.example.org", s.gw["zonea"]+":53", false); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
		t.Fatalf("resolve denied: %v", err)
	}

	// udp to an address not on the list: dropped by the guard
	const datagrams, payload = 5, 1200
	if _, err := s.sendUDP("zonea", net.JoinHostPort(inet, echoPort), datagrams, payload, false); err != nil {
		t.Fatal(err)
	}
	// tcp to the allowed name: through the proxy
	// (pipelined requests: the proxy peeks at most MaxPeek bytes for the
	// first head)
	const requests, requestSize = 8, 7500
	const sentProxied = requests * requestSize
	readProxied, err := s.sendTCP("zonea", inet+":80", requests, requestSize)
	if err != nil {
		t.Fatalf("proxied request: %v", err)
	}

	// the address on the list as a CIDR: udp and tcp by address
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName, inet + "/32"}})
	readUDP, err := s.sendUDP("zonea", net.JoinHostPort(inet, echoPort), datagrams, payload, true)
	if err != nil || readUDP != datagrams*payload {
		t.Fatalf("udp echo with the CIDR allowed: read %d of %d bytes: %v", readUDP, datagrams*payload, err)
	}
	const sentTCP = requests * requestSize
	readTCP, err := s.sendTCP("zonea", inet+":80", requests, requestSize)
	if err != nil {
		t.Fatalf("request by address: %v", err)
	}

	type found struct {
		refused     []Record
		conn        []Record
		udp, tcp    *Record
		other       []Record
		dnsVerdicts map[string]string
	}
	read := func() found {
		var f found
		f.dnsVerdicts = map[string]string{}
		for _, r := range elog.Read("sb-zonea", LogQuery{}).Records {
			switch {
			case r.Type == RecordDNS:
				f.dnsVerdicts[r.Name] = r.Verdict + "/" + r.Reason
			case r.Type == RecordConn:
				f.conn = append(f.conn, r)
			case r.Type == RecordFlow && r.Verdict == VerdictRefused:
				f.refused = append(f.refused, r)
			case r.Type == RecordFlow && r.Proto == "udp" && r.Dest.String() == net.JoinHostPort(inet, echoPort):
				f.udp = &r
			case r.Type == RecordFlow && r.Proto == "tcp" && r.Dest.String() == inet+":80":
				f.tcp = &r
			default:
				f.other = append(f.other, r)
			}
		}
		return f
	}
	var f found
	for range 120 { // conntrack ends a flow when its entry expires
		if f = read(); f.udp != nil && f.tcp != nil && len(f.conn) > 0 && len(f.refused) > 0 {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("record: dns %v; refused %+v; conn %+v; udp %+v; tcp %+v; flow stats %+v", f.dnsVerdicts, f.refused, f.conn, f.udp, f.tcp, flows.Stats())
	vmid := s.guests["zonea"].VMID
	if len(f.other) != 0 {
		t.Errorf("records of nothing the guest did: %+v", f.other)
	}

	if f.dnsVerdicts[testvm.InternetName] != VerdictAnswered+"/" || f.dnsVerdicts["evil.example.org"] != VerdictRefused+"/"+ReasonName {
		t.Errorf("DNS records %v", f.dnsVerdicts)
	}

	var refusedPackets, refusedBytes int64
	for _, r := range f.refused {
		if r.Reason != ReasonAddress || r.Dest.Addr().String() != inet || r.PacketsOut <= 0 {
			t.Errorf("refused flow %+v, want the internet host's address (reason address)", r)
		}
		refusedPackets += r.PacketsOut
		refusedBytes += r.BytesOut
	}
	if refusedPackets != datagrams || !within(refusedBytes, datagrams*(20+8+payload)) {
		t.Errorf("refused flows count %d packets, %d IP bytes; want the %d datagrams, %d bytes within one packet's worth",
			refusedPackets, refusedBytes, datagrams, datagrams*(20+8+payload))
	}

	if len(f.conn) != 1 {
		t.Errorf("proxy's connection records %+v, want one", f.conn)
	} else if c := f.conn[0]; c.Verdict != VerdictAllowed || c.Name != testvm.InternetName || c.Check != ReasonHost ||
		c.Dest.String() != inet+":80" || c.Guest.VMID != vmid || !within(c.BytesOut, sentProxied) || !within(c.BytesIn, readProxied) {
		t.Errorf("proxy's connection record %+v; want allowed by Host from VM %d, %d bytes out and %d in within one packet's worth",
			c, vmid, sentProxied, readProxied)
	}

	kernel := []struct {
		name              string
		r                 *Record
		hdr, synExtra     int64
		sentOut, readBack int64
	}{
		{name: "udp by CIDR", r: f.udp, hdr: 20 + 8, sentOut: datagrams * payload, readBack: readUDP},
		{name: "tcp by CIDR", r: f.tcp, hdr: 20 + 32, synExtra: 8, sentOut: sentTCP, readBack: readTCP},
	}
	for _, k := range kernel {
		if k.r == nil {
			t.Errorf("%s: no flow record", k.name)
			continue
		}
		r := *k.r
		if r.Verdict != VerdictAllowed || r.Guest.VMID != vmid || r.Guest.Addr != s.guests["zonea"].IPv4() || r.Time.IsZero() {
			t.Errorf("%s: flow %+v", k.name, r)
		}
		payOut := r.BytesOut - r.PacketsOut*k.hdr - k.synExtra
		payIn := r.BytesIn - r.PacketsIn*k.hdr - k.synExtra
		t.Logf("%s: %d IP bytes in %d packets out (payload %d, sent %d); %d in %d back (payload %d, read %d)",
			k.name, r.BytesOut, r.PacketsOut, payOut, k.sentOut, r.BytesIn, r.PacketsIn, payIn, k.readBack)
		if !within(payOut, k.sentOut) || !within(payIn, k.readBack) {
			t.Errorf("%s: payload out %d (sent %d), in %d (read %d)", k.name, payOut, k.sentOut, payIn, k.readBack)
		}
	}
	if f.udp != nil && f.udp.PacketsOut != datagrams {
		t.Errorf("udp flow counts %d packets out, the guest sent %d datagrams", f.udp.PacketsOut, datagrams)
	}
	for _, z := range []string{"sb-zoneb", "sb-zonec"} {
		if n := len(elog.Read(z, LogQuery{}).Records); n != 0 {
			t.Errorf("%s's record has %d entries", z, n)
		}
	}
	if st := flows.Stats(); st.Overruns != 0 || st.Bad != 0 {
		t.Errorf("flow stats %+v", st)
	}
}
