package ctguest

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// feedAll feeds data to a fresh preamble in pieces of size n (all at once
// for n <= 0) and returns the payload, the preamble and the first error.
func feedAll(sized bool, data []byte, n int) ([]byte, *preamble, error) {
	p := &preamble{sized: sized}
	var payload []byte
	for len(data) > 0 {
		k := len(data)
		if n > 0 {
			k = min(k, n)
		}
		out, err := p.feed(data[:k])
		if err != nil {
			return payload, p, err
		}
		payload = append(payload, out...)
		data = data[k:]
	}
	return payload, p, nil
}

// TestPreamble: the marker line (and a read's size line) is cut off the
// payload however the bytes are split; anything else before the payload
// is refused early, and a preamble line is bounded.
func TestPreamble(t *testing.T) {
	m := marker + "\n"
	tests := []struct {
		name    string
		sized   bool
		in      string
		payload string
		size    int64
		done    bool
		bad     bool
	}{
		{name: "marker and payload", in: m + "out\x00put\n", payload: "out\x00put\n", done: true},
		{name: "marker alone", in: m, done: true},
		{name: "part of the marker", in: marker[:5]},
		{name: "size and payload", sized: true, in: m + "12\nhello world!", payload: "hello world!", size: 12, done: true},
		{name: "size zero, no payload", sized: true, in: m + "0\n", done: true},
		{name: "size line not yet ended", sized: true, in: m + "12"},
		{name: "largest size", sized: true, in: m + "9223372036854775807\n", size: 9223372036854775807, done: true},
		{name: "size overflows", sized: true, in: m + "9999999999999999999\n", bad: true},
		{name: "size too long", sized: true, in: m + "00000000000000000001\n", bad: true},
		{name: "negative size", sized: true, in: m + "-1\n", bad: true},
		{name: "empty size", sized: true, in: m + "\n", bad: true},
		{name: "size with a space", sized: true, in: m + "1 \n", bad: true},
		{name: "another first line", in: "lxc-attach: failed\n", bad: true},
		{name: "marker with more", in: marker + "x\n", bad: true},
		{name: "marker with carriage return", in: marker + "\r\n", bad: true},
		{name: "a long first line", in: strings.Repeat("p", 100), bad: true},
		{name: "nothing", in: ""},
	}
	for _, tt := range tests {
		for _, n := range []int{0, 1, 3} {
			payload, p, err := feedAll(tt.sized, []byte(tt.in), n)
			if tt.bad {
				if !errors.Is(err, errPreamble) {
					t.Errorf("%s (pieces of %d): err %v, want a malformed preamble", tt.name, n, err)
				}
				continue
			}
			if err != nil || string(payload) != tt.payload || p.done() != tt.done || p.size != tt.size {
				t.Errorf("%s (pieces of %d): payload %q size %d done %v err %v; want %q %d %v", tt.name, n, payload, p.size, p.done(), err, tt.payload, tt.size, tt.done)
			}
		}
	}
}

// FuzzPreamble: the preamble never panics, keeps at most a bounded line,
// gives the same answer however the stream is split, and its payload is
// exactly what follows a well-formed preamble.
func FuzzPreamble(f *testing.F) {
	f.Add(true, []byte(marker+"\n5\nhello"), 3)
	f.Add(false, []byte(marker+"\nout"), 1)
	f.Add(true, []byte(marker+"\n18446744073709551616\n"), 2)
	f.Add(false, []byte("pve-inspect-ctguest 2\n"), 7)
	f.Fuzz(func(t *testing.T, sized bool, data []byte, n int) {
		whole, pw, errw := feedAll(sized, data, 0)
		split, ps, errs := feedAll(sized, data, n%17)
		if (errw == nil) != (errs == nil) || !bytes.Equal(whole, split) || pw.done() != ps.done() || pw.size != ps.size {
			t.Fatalf("whole: %q %v %v; in pieces of %d: %q %v %v", whole, pw.done(), errw, n%17, split, ps.done(), errs)
		}
		if len(pw.line) >= maxPreambleLine {
			t.Fatalf("kept a line of %d bytes", len(pw.line))
		}
		if errw != nil {
			return
		}
		rest, ok := bytes.CutPrefix(data, []byte(marker+"\n"))
		if pw.done() && !ok {
			t.Fatalf("done without the marker: %q", data)
		}
		if pw.done() && sized {
			i := bytes.IndexByte(rest, '\n')
			if i < 1 || pw.size < 0 {
				t.Fatalf("done without a size line: %q", data)
			}
			rest = rest[i+1:]
		}
		if pw.done() && !bytes.Equal(whole, rest) {
			t.Fatalf("payload %q, want %q", whole, rest)
		}
		if !pw.done() && len(whole) != 0 {
			t.Fatalf("payload %q before the preamble ended", whole)
		}
	})
}
