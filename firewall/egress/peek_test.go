package egress

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// clientHello returns the first bytes crypto/tls sends for serverName.
func clientHello(t testing.TB, serverName string, minVersion uint16) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, MinVersion: minVersion, InsecureSkipVerify: true}) //nolint:gosec // bytes only, no peer
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_ = c.Handshake()
	}()
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, MaxPeek)
	var got []byte
	for {
		n, err := b.Read(buf)
		got = append(got, buf[:n]...)
		if _, _, perr := peekName(got); !errors.Is(perr, errNeedMore) || err != nil {
			return got
		}
	}
}

// splitRecords re-frames a one-record ClientHello into records of at
// most n fragment bytes each (legal TLS that a naive parser misses).
func splitRecords(rec []byte, n int) []byte {
	frag := rec[5:]
	var out []byte
	for len(frag) > 0 {
		k := min(n, len(frag))
		out = append(out, 0x16, 3, 1)
		out = binary.BigEndian.AppendUint16(out, uint16(k))
		out = append(out, frag[:k]...)
		frag = frag[k:]
	}
	return out
}

func TestPeekTLS(t *testing.T) {
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		hello := clientHello(t, "Files.PyPI.org", v)
		for _, tc := range []struct {
			name string
			b    []byte
		}{
			{"one record", hello},
			{"records of 100 bytes", splitRecords(hello, 100)},
			{"records of 1 byte", splitRecords(hello, 1)},
		} {
			name, kind, err := peekName(tc.b)
			if err != nil || name != "files.pypi.org" || kind != kindTLS {
				t.Errorf("tls %x %s: %q %q %v", v, tc.name, name, kind, err)
			}
			for _, cut := range []int{1, 4, 5, len(tc.b) / 2, len(tc.b) - 1} {
				if _, _, err := peekName(tc.b[:cut]); !errors.Is(err, errNeedMore) {
					t.Errorf("tls %x %s: prefix of %d bytes: %v, want need-more", v, tc.name, cut, err)
				}
			}
		}
	}
	if _, _, err := peekName(clientHello(t, "", tls.VersionTLS13)); err == nil {
		t.Error("a ClientHello without server_name was accepted")
	}
	if _, _, err := peekName(clientHello(t, "203.0.113.7", tls.VersionTLS13)); err == nil {
		t.Error("a ClientHello without a name (IP literal) was accepted")
	}
}

func TestPeekHTTP(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"GET / HTTP/1.1\r\nHost: PyPI.org\r\n\r\n", "pypi.org", true},
		{"GET /simple/ HTTP/1.1\r\nUser-Agent: pip\r\nhost: pypi.org:80\r\nAccept: */*\r\n\r\n", "pypi.org", true},
		{"GET http://pypi.org/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", true},
		{"GET http://evil.org/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "", false},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.org\r\n\r\n", "", false},
		{"GET / HTTP/1.1\r\n\r\n", "", false},
		{"GET / HTTP/1.0\r\nHost: 203.0.113.7\r\n\r\n", "", false},
		{"CONNECT evil.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "", false},
		{"GET / HTTP/2.0\r\nHost: pypi.org\r\n\r\n", "", false},
		{"SSH-2.0-OpenSSH_9.6\r\n", "", false},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\nbroken\r\n\r\n", "", false},
	}
	for _, tc := range cases {
		got, kind, err := peekName([]byte(tc.in))
		if tc.ok && (err != nil || got != tc.want || kind != kindHTTP) {
			t.Errorf("%q: %q %q %v, want %q", tc.in, got, kind, err, tc.want)
		}
		if !tc.ok && err == nil {
			t.Errorf("%q: accepted as %q", tc.in, got)
		}
	}
	if _, _, err := peekName([]byte("GET / HTTP/1.1\r\nHost: py")); !errors.Is(err, errNeedMore) {
		t.Errorf("partial head: %v, want need-more", err)
	}
	if _, _, err := peekName([]byte("GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxPeek))); err == nil || errors.Is(err, errNeedMore) {
		t.Errorf("over-long head: %v, want an error", err)
	}
}

// FuzzPeekName: no input panics, a name found is valid lower-case DNS
// syntax, and need-more never comes back for MaxPeek bytes or more.
func FuzzPeekName(f *testing.F) {
	f.Add(clientHello(f, "pypi.org", tls.VersionTLS13))
	f.Add(splitRecords(clientHello(f, "a.example.org", tls.VersionTLS12), 7))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, _, err := peekName(b)
		if err == nil {
			if n, cerr := checkedName(name); cerr != nil || n != name {
				t.Fatalf("returned name %q is not clean: %v", name, cerr)
			}
		}
		if errors.Is(err, errNeedMore) && len(b) >= 5*MaxPeek {
			t.Fatalf("need-more after %d bytes", len(b))
		}
	})
}
