package testvm

import (
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestServicesCloseAtOnce: services closed right after they were started
// (a bed whose Up fails past its services) return, for DNS servers over
// UDP and TCP whose goroutines had not begun to serve too.
func TestServicesCloseAtOnce(t *testing.T) {
	for _, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			for range 50 {
				s := &services{}
				srv := &dns.Server{Net: proto, Handler: dns.HandlerFunc(internetDNS)}
				if proto == "udp" {
					pc, err := net.ListenPacket("udp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					srv.PacketConn = pc
				} else {
					l, err := net.Listen("tcp", "127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					srv.Listener = l
				}
				s.serveDNS(srv)
				done := make(chan struct{})
				go func() { s.close(); close(done) }()
				select {
				case <-done:
				case <-time.After(time.Minute):
					t.Fatal("close never returned: a DNS server serves on")
				}
			}
		})
	}
}
