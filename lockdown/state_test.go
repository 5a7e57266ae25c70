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

func TestInForce(t *testing.T) {
	d := t.TempDir()
	marker, state := filepath.Join(d, "marker"), filepath.Join(d, "state.json")
	now := time.Now().UTC()
	if err := InForce(marker, state, time.Minute, now); err != nil {
		t.Errorf("no marker: %v, want nil", err)
	}
	if err := SetMarker(marker, true); err != nil {
		t.Fatal(err)
	}
	good := State{Marker: true, Enforced: true, Converged: true, PID: os.Getpid(), Updated: now}
	for _, tc := range []struct {
		name  string
		state *State
		want  string // "" = in force
	}{
		{"no state", nil, "not proven"},
		{"enforced", &good, ""},
		{"not enforced", &State{Marker: true, Reason: "verify-failed: x", PID: os.Getpid(), Updated: now}, "verify-failed"},
		{"dead daemon", &State{Marker: true, Enforced: true, PID: 1 << 30, Updated: now}, "not running"},
		{"stale", &State{Marker: true, Enforced: true, PID: os.Getpid(), Updated: now.Add(-time.Hour)}, "stale"},
		{"not acted", &State{Marker: false, Converged: true, PID: os.Getpid(), Updated: now}, "not acted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(state)
			if tc.state != nil {
				if err := WriteState(state, *tc.state); err != nil {
					t.Fatal(err)
				}
			}
			err := InForce(marker, state, time.Minute, now)
			if tc.want == "" {
				if err != nil {
					t.Errorf("InForce = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("InForce = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
