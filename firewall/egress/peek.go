package egress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// MaxPeek bounds how many bytes of a connection are read to find its
// server name (a ClientHello with post-quantum key shares is under 2 KiB;
// 16 KiB is the largest TLS record).
const MaxPeek = 16 << 10

// errNeedMore means the bytes so far end before the name can be known.
var errNeedMore = errors.New("need more bytes")

// Kinds of first bytes.
const (
	kindTLS  = "tls"
	kindHTTP = "http"
)

// peekName finds the server name in the first bytes b of a guest's
// connection: the TLS ClientHello's server_name, or the HTTP/1 Host.
// It returns errNeedMore while b is a valid prefix shorter than needed.
// The name is lower case and has valid DNS syntax.
func peekName(b []byte) (name, kind string, err error) {
	if len(b) == 0 {
		return "", "", errNeedMore
	}
	if b[0] == 0x16 {
		name, err = clientHelloSNI(b)
		return name, kindTLS, err
	}
	name, err = httpHost(b)
	return name, kindHTTP, err
}

// clientHelloSNI reassembles the handshake message from TLS records and
// returns the host_name of its server_name extension.
func clientHelloSNI(b []byte) (string, error) {
	var hs []byte
	for {
		if len(b) < 5 {
			return "", errNeedMore
		}
		if b[0] != 0x16 {
			return "", fmt.Errorf("tls: record type %d, want handshake", b[0])
		}
		if b[1] != 3 {
			return "", fmt.Errorf("tls: record version %d.%d", b[1], b[2])
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n == 0 || n > 1<<14 {
			return "", fmt.Errorf("tls: record length %d", n)
		}
		if len(b) < 5+n {
			return "", errNeedMore
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
		if len(hs) < 4 {
			continue
		}
		if hs[0] != 1 {
			return "", fmt.Errorf("tls: handshake type %d, want client hello", hs[0])
		}
		l := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
		if l > MaxPeek {
			return "", fmt.Errorf("tls: client hello of %d bytes", l)
		}
		if len(hs) >= 4+l {
			return helloSNI(hs[4 : 4+l])
		}
	}
}

// reader takes length-prefixed fields off a byte slice; any overrun sets
// bad.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	v := r.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.take(2)
	if v == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(v))
}

// helloSNI parses a ClientHello body (RFC 8446 4.1.2, RFC 6066 3).
func helloSNI(body []byte) (string, error) {
	r := &reader{b: body}
	r.take(2 + 32)         // legacy_version, random
	r.take(r.u8())         // legacy_session_id
	r.take(r.u16())        // cipher_suites
	r.take(r.u8())         // legacy_compression_methods
	ext := r.take(r.u16()) // extensions
	if r.bad {
		return "", errors.New("tls: malformed client hello")
	}
	er := &reader{b: ext}
	for len(er.b) > 0 {
		typ := er.u16()
		data := er.take(er.u16())
		if er.bad {
			return "", errors.New("tls: malformed extensions")
		}
		if typ != 0 {
			continue
		}
		sr := &reader{b: data}
		list := &reader{b: sr.take(sr.u16())}
		for len(list.b) > 0 && !list.bad {
			nt := list.u8()
			host := list.take(list.u16())
			if nt == 0 && !list.bad {
				return checkedName(string(host))
			}
		}
		return "", errors.New("tls: malformed server_name extension")
	}
	return "", errors.New("tls: no server_name")
}

// httpHost returns the Host of an HTTP/1 request head.
func httpHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= MaxPeek {
			return "", errors.New("http: request head too long")
		}
		// fail early on what cannot become a request line
		if i := bytes.IndexByte(b, ' '); i == 0 || i > 16 || (i < 0 && len(b) > 16) {
			return "", errors.New("http: not an HTTP request")
		}
		return "", errNeedMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") || parts[0] == "" || parts[0] == "CONNECT" {
		return "", errors.New("http: bad request line")
	}
	var host string
	seen := 0
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return "", errors.New("http: bad header line")
		}
		if strings.EqualFold(strings.TrimSpace(k), "host") {
			host = strings.TrimSpace(v)
			seen++
		}
	}
	if seen != 1 {
		return "", fmt.Errorf("http: %d Host headers, want 1", seen)
	}
	name, err := checkedName(stripPort(host))
	if err != nil {
		return "", err
	}
	// absolute-form: the target's host must be the same name
	if t, ok := strings.CutPrefix(strings.ToLower(parts[1]), "http://"); ok {
		th, _, _ := strings.Cut(t, "/")
		if stripPort(th) != name {
			return "", errors.New("http: request target and Host name differ")
		}
	}
	return name, nil
}

func stripPort(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

// checkedName lower-cases s and checks DNS name syntax; an IP literal is
// not a name.
func checkedName(s string) (string, error) {
	n := strings.ToLower(strings.TrimSuffix(s, "."))
	if _, err := netip.ParseAddr(n); err == nil {
		return "", fmt.Errorf("server name %q is an address, not a name", s)
	}
	if err := checkName(n); err != nil {
		return "", fmt.Errorf("server name %q: %w", s, err)
	}
	return n, nil
}
