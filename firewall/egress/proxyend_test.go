package egress

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// TestProxyEndOf: a connection is recorded when it ends, so one its
// guest left open (the guest gone with its VM, the connection lasts
// until IdleTimeout or its destination closes) was recorded after the
// sandbox's record was handed over at its delete, and so nowhere: the
// guest kept what it sent out of the record (review16). EndOf closes the
// connections from the sandbox's bridges and returns once each is
// recorded, with the bytes relayed until then; another bridge's are left
// alone; a connection that does not end in time ends the wait at its
// context.
func TestProxyEndOf(t *testing.T) {
	up, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	var got atomic.Int64 // bytes the destination received
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() { // reads all, answers nothing, never closes
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					got.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressNone}, nil)
	allow, _ := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org"}})
	if err := reg.Set(context.Background(), "za", "sb-a", []string{"vneta"}, allow); err != nil {
		t.Fatal(err)
	}
	if err := reg.Set(context.Background(), "zb", "sb-b", []string{"vnetb"}, allow); err != nil {
		t.Fatal(err)
	}
	log := NewLog(LogConfig{})
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", up.Addr().String())
	}
	p := NewProxy(ProxyConfig{Dial: dial, Log: log, PeekTimeout: 5 * time.Second}, reg, nil, NewDenials(), slog.New(slog.DiscardHandler))
	dst := netip.MustParseAddrPort("203.0.113.10:443")
	req := "POST / HTTP/1.1\r\nHost: pypi.org\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("y", 5000)
	served := make(chan struct{}, 2)
	for _, iface := range []string{"vneta", "vnetb"} {
		guest, proxySide := tcpPair(t)
		defer guest.Close()
		go func() {
			p.serve(context.Background(), proxySide, iface, dst)
			_ = proxySide.Close()
			served <- struct{}{}
		}()
		if _, err := guest.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); got.Load() < int64(2*len(req)) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.EndOf(ctx, reg.BridgesOf("sb-a")); err != nil {
		t.Fatal(err)
	}
	h := log.Take("sb-a")
	defer h.Release()
	var recs []Record
	_ = h.Each(func(r Record) error { recs = append(recs, r); return nil })
	if len(recs) != 1 || recs[0].Type != RecordConn || recs[0].Verdict != VerdictAllowed || recs[0].BytesOut != int64(len(req)) {
		t.Errorf("handed over %+v, want the connection left open, allowed, its %d bytes out", recs, len(req))
	}
	if n := p.Live("vnetb"); n != 1 {
		t.Errorf("sb-b's connections: %d, want its one left alone", n)
	}
	<-served
	select {
	case <-served:
		t.Error("sb-b's connection ended too")
	default:
	}
	// one that does not end in time (here: its serve is held)
	p.mu.Lock()
	p.open["vnetc"]++
	p.mu.Unlock()
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if err := p.EndOf(short, []string{"vnetc"}); err == nil {
		t.Error("EndOf of a connection that does not end: no error")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) != 0 {
		t.Errorf("waiters left: %v", p.idle)
	}
}
