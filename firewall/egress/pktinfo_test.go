package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// loLinks names the loopback interface vneta, every other index nothing.
type loLinks struct{ lo int }

func (l loLinks) ByIndex(i int) (string, error) {
	if i != l.lo {
		return "", errors.New("no such interface")
	}
	return "vneta", nil
}

func (loLinks) ByAddr(netip.Addr) (string, error) { return "", errors.New("no address") }

func (loLinks) Holds(int, netip.Addr) (bool, error) { return false, errors.New("no address") }

// waitQueued waits until a datagram waits on pc's socket (SIOCINQ), so
// that it was queued before whatever the caller starts next.
func waitQueued(t *testing.T, pc net.PacketConn) {
	t.Helper()
	raw, err := pc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		n, serr := 0, error(nil)
		if err := raw.Control(func(fd uintptr) { n, serr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || serr != nil {
			t.Fatal(errors.Join(err, serr))
		}
		if n > 0 {
			return
		}
	}
	t.Fatal("no datagram reached the resolver's socket")
}

// TestServeUDPQueuedQuestion: a question that reached the resolver's
// socket before its read loop ran (the guard redirects guest DNS there
// before the daemon reads it) is answered like one sent to the running
// loop: the socket carries IP_PKTINFO from its bind, so the kernel
// queued it with its interface. A socket bound without the option is
// refused: what was queued on it before would be read without an
// interface and dropped.
func TestServeUDPQueuedQuestion(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skipf("no loopback interface: %v", err)
	}
	listenUDP := func(ctx context.Context, addr string) (net.PacketConn, error) { return ListenUDP(ctx, addr) }
	listenPlain := func(_ context.Context, addr string) (net.PacketConn, error) { return net.ListenPacket("udp4", addr) }
	for _, tc := range []struct {
		name    string
		listen  func(context.Context, string) (net.PacketConn, error)
		queued  bool // the question is sent before ServeUDP starts
		refused bool // ServeUDP refuses the socket
	}{
		{"queued before the read loop", listenUDP, true, false},
		{"sent as the read loop starts", listenUDP, false, false},
		{"socket bound without IP_PKTINFO", listenPlain, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newResolverFixture(t)
			f.res.links = loLinks{lo: lo.Index}
			pc, err := tc.listen(context.Background(), "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			if tc.refused {
				// cancelled: a ServeUDP that took the socket returns at once
				done, stop := context.WithCancel(ctx)
				stop()
				if err := f.res.ServeUDP(done, pc); err == nil {
					t.Fatal("ServeUDP served a socket bound without IP_PKTINFO")
				}
				return
			}
			c, err := net.Dial("udp4", pc.LocalAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			serve := func() {
				wg.Go(func() {
					if err := f.res.ServeUDP(ctx, pc); err != nil {
						t.Errorf("ServeUDP: %v", err)
					}
				})
			}
			if !tc.queued {
				serve()
			}
			co := &dns.Conn{Conn: c}
			if _, err := c.Write(query(t, "pypi.org.", dns.TypeA)); err != nil {
				t.Fatal(err)
			}
			if tc.queued {
				waitQueued(t, pc)
				serve()
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			m, err := co.ReadMsg()
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			var got []string
			for _, rr := range m.Answer {
				if a, ok := rr.(*dns.A); ok {
					got = append(got, a.A.String())
				}
			}
			if m.Rcode != dns.RcodeSuccess || !slices.Equal(got, []string{"203.0.113.10"}) {
				t.Errorf("answer %s %v, want NOERROR [203.0.113.10]", dns.RcodeToString[m.Rcode], got)
			}
		})
	}
}
