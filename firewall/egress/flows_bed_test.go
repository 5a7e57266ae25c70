package egress

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestEgressFlowsOnBed: a guest in open mode (whose traffic never passes
// the daemon) sends a known number of bytes over TCP to the internet
// host's HTTP port and exchanges one DNS datagram with its resolver; its
// sandbox's record lists both flows with conntrack's counts, which are
// IP bytes: each packet's IP and TCP (or UDP) headers on top of the
// payload. So the test takes the headers off (20 bytes of IP, 32 of TCP
// with timestamps, 8 more options on the SYN; 8 of UDP) and wants the
// payload within one packet's worth (1500 bytes) of what was sent and
// read. The other sandboxes' records stay empty.
func TestEgressFlowsOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	elog := NewLog(LogConfig{PerOwner: 64})
	s := newStack(t, ctx, Policy{Mode: "open"})
	for _, z := range []string{"zonea", "zoneb", "zonec"} {
		s.set(t, ctx, z, Policy{Mode: "open"})
	}
	s.conntrackAcct(t)
	flows, _ := s.startFlows(t, ctx, elog, FlowConfig{})

	// tcp: one request of exactly sentTCP bytes, the answer read to EOF
	const sentTCP = 100000
	readTCP, err := s.sendTCP("zonec", testvm.InternetAddr+":80", 1, sentTCP)
	if err != nil {
		t.Fatal(err)
	}
	// udp: one DNS question, one answer
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(testvm.InternetName), dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var readUDP int
	if err := s.b.Do(s.guests["zonec"].NS, func() error {
		c, err := net.Dial("udp4", testvm.InternetAddr+":53")
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(wire); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		readUDP, err = c.Read(buf)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if readTCP == 0 || readUDP == 0 {
		t.Fatalf("read %d bytes over tcp, %d over udp", readTCP, readUDP)
	}

	var recs []Record
	for range 120 { // conntrack ends a flow when its entry expires
		recs = elog.Read("sb-zonec", LogQuery{Type: RecordFlow}).Records
		if len(recs) >= 2 {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("flows %+v; stats %+v", recs, flows.Stats())
	vmid := s.guests["zonec"].VMID
	got := map[string]Record{}
	for _, r := range recs {
		got[r.Proto+" "+r.Dest.String()] = r
	}
	const onePacket = 1500
	cases := []struct {
		key               string
		hdr, synExtra     int64
		sentOut, readBack int64
	}{
		{key: "tcp " + testvm.InternetAddr + ":80", hdr: 20 + 32, synExtra: 8, sentOut: sentTCP, readBack: readTCP},
		{key: "udp " + testvm.InternetAddr + ":53", hdr: 20 + 8, sentOut: int64(len(wire)), readBack: int64(readUDP)},
	}
	for _, tc := range cases {
		r, ok := got[tc.key]
		if !ok {
			t.Errorf("no flow %s in %+v", tc.key, recs)
			continue
		}
		if r.Verdict != VerdictAllowed || r.Guest.VMID != vmid || r.Guest.Addr != s.guests["zonec"].IPv4() || r.Time.IsZero() {
			t.Errorf("flow %s: %+v", tc.key, r)
		}
		payOut := r.BytesOut - r.PacketsOut*tc.hdr - tc.synExtra
		payIn := r.BytesIn - r.PacketsIn*tc.hdr - tc.synExtra
		t.Logf("%s: %d IP bytes in %d packets out (payload %d, sent %d); %d in %d back (payload %d, read %d)",
			tc.key, r.BytesOut, r.PacketsOut, payOut, tc.sentOut, r.BytesIn, r.PacketsIn, payIn, tc.readBack)
		if d := payOut - tc.sentOut; d < -onePacket || d > onePacket {
			t.Errorf("%s: payload out %d, sent %d", tc.key, payOut, tc.sentOut)
		}
		if d := payIn - tc.readBack; d < -onePacket || d > onePacket {
			t.Errorf("%s: payload in %d, read %d", tc.key, payIn, tc.readBack)
		}
		if r.BytesOut < tc.sentOut {
			t.Errorf("%s: %d IP bytes out for %d bytes sent", tc.key, r.BytesOut, tc.sentOut)
		}
	}
	for _, z := range []string{"sb-zonea", "sb-zoneb"} {
		if n := len(elog.Read(z, LogQuery{}).Records); n != 0 {
			t.Errorf("%s's record has %d entries", z, n)
		}
	}
	if st := flows.Stats(); st.Overruns != 0 || st.Bad != 0 {
		t.Errorf("stats %+v", st)
	}
}

// conntrackAcct sets in the node's namespace what the guard sets in a
// real node's (its ProcRoot is a scratch directory here), and short
// conntrack timeouts so that the flows end (DESTROY) soon after they
// close.
func (s *stack) conntrackAcct(t *testing.T) {
	t.Helper()
	if err := s.b.Do(s.b.NodeNS(), func() error {
		for k, v := range map[string]string{"nf_conntrack_acct": "1", "nf_conntrack_tcp_timeout_time_wait": "1",
			"nf_conntrack_udp_timeout": "2", "nf_conntrack_udp_timeout_stream": "2"} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net/netfilter", k), []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// startFlows runs a Flows over the node's conntrack into elog (cfg's
// ports are the guard's) until the test ends, and returns it once it
// listens (a flow that ends before then is never seen), with a stop
// that ends its Run and waits for it (after which Live may be read).
func (s *stack) startFlows(t *testing.T, ctx context.Context, elog *Log, cfg FlowConfig) (*Flows, func()) {
	t.Helper()
	node, err := netns.GetFromName(s.b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	cfg.DNSPort, cfg.ProxyPort = firewall.EgressConfig{}.Ports()
	cfg.NetNS = node
	flows := NewFlows(cfg, s.reg, elog, &PortGuests{Ports: s.g.Ports}, &PrefixAddrs{List: s.links.Prefixes},
		slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- flows.Run(fctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("flows: %v", err)
		}
	})
	t.Cleanup(stop)
	select {
	case <-flows.Ready():
	case <-ctx.Done():
		t.Fatal("flows never listened")
	}
	return flows, stop
}
