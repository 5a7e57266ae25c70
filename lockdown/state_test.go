package lockdown

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStateRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "lockdown.json")
	in := State{Marker: true, Enforced: true, Converged: true, Management: []string{"vmbr0"},
		LastAssert: time.Unix(1700000000, 0).UTC(), Updated: time.Unix(1700000001, 0).UTC(), PID: 42}
	if err := WriteState(p, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadState(p)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Marker || !out.Enforced || out.PID != 42 || !out.Updated.Equal(in.Updated) || len(out.Management) != 1 {
		t.Errorf("round trip = %+v, want %+v", out, in)
	}
	if _, err := ReadState(filepath.Join(t.TempDir(), "none.json")); err != ErrNoState {
		t.Errorf("missing state file: %v, want ErrNoState", err)
	}
}

func TestParseStateRejects(t *testing.T) {
	for _, doc := range []string{
		"",
		"{",
		`{"marker": true, "surprise": 1}`,
		`{"marker": true} {"marker": false}`,
		`{"pid": -1}`,
		`{"marker": "yes"}`,
		`{"marker":true,"reason":"` + strings.Repeat("x", maxStateSize) + `"}`,
	} {
		if _, err := ParseState([]byte(doc)); err == nil {
			t.Errorf("ParseState(%.40q) accepted", doc)
		}
	}
}

func FuzzParseState(f *testing.F) {
	f.Add([]byte(`{"marker":true,"enforced":true,"converged":true,"management":["vmbr0"],"pid":1}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseState(b)
		if err != nil {
			return
		}
		if s.PID < 0 {
			t.Errorf("accepted pid %d", s.PID)
		}
		// What parses survives a write and a read.
		p := filepath.Join(t.TempDir(), "s.json")
		if err := WriteState(p, s); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadState(p); err != nil {
			t.Errorf("re-read of a parsed state: %v", err)
		}
		_ = os.Remove(p)
	})
}
