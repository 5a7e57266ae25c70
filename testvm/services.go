package testvm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// services are the bed's in-process servers. Their sockets were opened
// inside the uplink and node namespaces, so they serve those namespaces.
type services struct {
	wg        sync.WaitGroup
	closers   []io.Closer
	dnsServer []*dns.Server
}

func (s *services) close() {
	for _, c := range s.closers {
		_ = c.Close()
	}
	for _, d := range s.dnsServer {
		// Shutdown stops only a server that has started serving; one
		// whose goroutine has not got that far (a bed torn down at once,
		// its Up failing) would serve on for ever: its socket closed,
		// it returns.
		_ = d.Shutdown()
		if d.PacketConn != nil {
			_ = d.PacketConn.Close()
		}
		if d.Listener != nil {
			_ = d.Listener.Close()
		}
	}
	s.wg.Wait()
}

// serveDNS serves srv (its PacketConn or Listener set) until close.
func (s *services) serveDNS(srv *dns.Server) {
	s.dnsServer = append(s.dnsServer, srv)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = srv.ActivateAndServe()
	}()
}

func (s *services) serveHTTP(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	s.closers = append(s.closers, srv)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = srv.Serve(ln)
	}()
}

func startServices(b *Bed, nodePorts []int, imagesDir string) (_ *services, err error) {
	s := &services{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	cert, err := selfSigned()
	if err != nil {
		return nil, err
	}
	err = b.Do(b.UplinkNS(), func() error {
		ln80, err := net.Listen("tcp", ":80")
		if err != nil {
			return err
		}
		up := uplinkHTTP(imagesDir)
		s.serveHTTP(ln80, up)
		ln443, err := net.Listen("tcp", ":443")
		if err != nil {
			return err
		}
		s.serveHTTP(tls.NewListener(ln443, &tls.Config{Certificates: []tls.Certificate{cert}}), up)
		for _, a := range []string{InternetAddr, AWSDNSAddr} {
			for _, proto := range []string{"udp", "tcp"} {
				srv := &dns.Server{Addr: net.JoinHostPort(a, "53"), Net: proto, Handler: dns.HandlerFunc(internetDNS)}
				if proto == "udp" {
					pc, err := net.ListenPacket("udp", srv.Addr)
					if err != nil {
						return err
					}
					srv.PacketConn = pc
				} else {
					l, err := net.Listen("tcp", srv.Addr)
					if err != nil {
						return err
					}
					srv.Listener = l
				}
				s.serveDNS(srv)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("uplink services: %w", err)
	}
	err = b.Do(b.NodeNS(), func() error {
		for _, p := range nodePorts {
			ln, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				return fmt.Errorf("node stand-in :%d: %w", p, err)
			}
			port := p
			s.serveHTTP(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "pve-inspect testbed node port %d\n", port)
			}))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// uplinkHTTP answers as whichever host the connection was made to; the
// internet host serves imagesDir's files under /images/ when it is set.
func uplinkHTTP(imagesDir string) http.Handler {
	var images http.Handler
	if imagesDir != "" {
		images = http.StripPrefix("/images/", http.FileServer(http.Dir(imagesDir)))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		host := ""
		if ta, ok := la.(*net.TCPAddr); ok {
			host = ta.IP.String()
		}
		if images != nil && (host == InternetAddr || host == InternetAddr6) && strings.HasPrefix(r.URL.Path, "/images/") {
			images.ServeHTTP(w, r)
			return
		}
		uplinkHost(w, r, host)
	})
}

// uplinkHost is the answer of the uplink's host host.
func uplinkHost(w http.ResponseWriter, r *http.Request, host string) {
	switch host {
	case MetadataAddr, MetadataAddr6, AlibabaMDAddr, AzureWireAddr:
		metadataHTTP(w, r)
	case InternetAddr, InternetAddr6:
		fmt.Fprintln(w, "internet host")
	case LANAddr:
		fmt.Fprintln(w, "lan host")
	default:
		http.NotFound(w, r)
	}
}

// metadataHTTP is a small IMDSv2-shaped service.
func metadataHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
		if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
			http.Error(w, "missing ttl header", http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, "testbed-imds-token")
	case r.Method == http.MethodGet && r.URL.Path == "/latest/meta-data/instance-id":
		fmt.Fprint(w, InstanceID)
	case r.Method == http.MethodGet:
		fmt.Fprintln(w, "metadata")
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// internetDNS answers example.test (A InternetAddr, AAAA InternetAddr6,
// TXT InternetTXT) and
// NXDOMAIN for everything else.
func internetDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	if len(q.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	qq := q.Question[0]
	name := strings.ToLower(qq.Name)
	if name != dns.Fqdn(InternetName) && !strings.HasSuffix(name, "."+dns.Fqdn(InternetName)) {
		m.Rcode = dns.RcodeNameError
		_ = w.WriteMsg(m)
		return
	}
	hdr := dns.RR_Header{Name: qq.Name, Class: dns.ClassINET, Rrtype: qq.Qtype, Ttl: 60}
	switch qq.Qtype {
	case dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.ParseIP(InternetAddr)})
	case dns.TypeAAAA:
		m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.ParseIP(InternetAddr6)})
	case dns.TypeTXT:
		m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: []string{InternetTXT}})
	}
	_ = w.WriteMsg(m)
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: InternetName},
		DNSNames:     []string{InternetName},
		IPAddresses:  []net.IP{net.ParseIP(InternetAddr), net.ParseIP(InternetAddr6)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if len(der) == 0 {
		return tls.Certificate{}, errors.New("empty certificate")
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
