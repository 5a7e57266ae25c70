package lockdown

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/lockdown"
)

func TestStats(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Millisecond
		}
		return d
	}
	for _, tc := range []struct {
		name               string
		in                 []time.Duration
		min, p50, p99, max time.Duration
	}{
		{"empty", nil, 0, 0, 0, 0},
		{"one", ms(7), 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond},
		{"unsorted four", ms(4, 1, 3, 2), time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 4 * time.Millisecond},
		{"hundred", ms(func() []int {
			v := make([]int, 100)
			for i := range v {
				v[i] = 100 - i
			}
			return v
		}()...), time.Millisecond, 50 * time.Millisecond, 99 * time.Millisecond, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Stats(tc.in)
			if s.N != len(tc.in) || s.Min != tc.min || s.P50 != tc.p50 || s.P99 != tc.p99 || s.Max != tc.max {
				t.Errorf("Stats = %+v, want n=%d min=%v p50=%v p99=%v max=%v", s, len(tc.in), tc.min, tc.p50, tc.p99, tc.max)
			}
		})
	}
}

// TestBenchAgainstController runs Bench on a real controller (fake guard):
// the probe observes the guard's lockdown state, as a guest would observe
// the firewall. Event driven and behind the reference timer (the
// reference model) both converge on every flip.
func TestBenchAgainstController(t *testing.T) {
	for _, tc := range []struct {
		name   string
		timer  time.Duration // the reference timer's period; 0: none
		jitter time.Duration
	}{
		{"events", 0, 0},
		{"reference timer", 20 * time.Millisecond, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.timer > 0 {
				e.startTimer(tc.timer)
			}
			e.start()
			probes := 0
			res, err := Bench(context.Background(), BenchOptions{
				Flips:        6,
				SetMarker:    func(_ context.Context, on bool) error { return lockdown.SetMarker(e.marker, on) },
				Probe:        func(context.Context) (bool, error) { probes++; lk, _ := e.guard.get(); return lk, nil },
				FlipTimeout:  15 * time.Second,
				SettleJitter: tc.jitter,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.On.N != 3 || res.Off.N != 3 || res.All.N != 6 || len(res.Samples) != 6 {
				t.Fatalf("result %+v, want 3 on and 3 off samples", res)
			}
			for i, s := range res.Samples {
				if s.On != (i%2 == 0) || s.Probes < 1 || s.Lower > s.Latency {
					t.Errorf("sample %d = %+v", i, s)
				}
			}
			if res.All.Max < res.All.P99 || res.All.P99 < res.All.P50 || res.All.P50 < res.All.Min {
				t.Errorf("stats not ordered: %+v", res.All)
			}
			// With an even number of flips the marker ends removed.
			e.waitLifted()
			e.checkLifted()
		})
	}
}

func TestBenchErrors(t *testing.T) {
	if _, err := Bench(context.Background(), BenchOptions{}); err == nil {
		t.Error("Bench without SetMarker and Probe succeeded")
	}
	// A probe that never reports the asked-for state ends in a timeout
	// error naming the last probe error.
	marker := false
	_, err := Bench(context.Background(), BenchOptions{
		Flips:       2,
		SetMarker:   func(_ context.Context, on bool) error { marker = on; return nil },
		Probe:       func(context.Context) (bool, error) { return false, errors.New("guest agent gone") },
		FlipTimeout: 100 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "guest agent gone") {
		t.Errorf("Bench with a failing probe = %v, want an error naming the probe error", err)
	}
	if marker {
		t.Error("marker left on after the initial reset")
	}
}

func TestWriteBenchReport(t *testing.T) {
	ours := BenchResult{On: Stats([]time.Duration{time.Millisecond}), Off: Stats([]time.Duration{2 * time.Millisecond})}
	base := BenchResult{On: Stats([]time.Duration{30 * time.Second})}
	var b bytes.Buffer
	if err := WriteBenchReport(&b, ours, &base); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"pve-inspectd, marker on -> blocked", "baseline (poll-only, measured)", "1m15s", "30s", "59.4s"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestBenchConfirm: a lone false "blocked" (a probe that timed out on a
// loaded host) does not end a flip; the agreeing run after it does.
func TestBenchConfirm(t *testing.T) {
	const o, b = false, true // open, blocked
	for _, tc := range []struct {
		name    string
		confirm int
		script  []bool // initial state (open) then the on flip
		probes  int    // probes of the on flip
	}{
		{"default", 0, []bool{o, o, o, o, b, o, b, b, b}, 6},
		{"none", -1, []bool{o, o, b}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			res, err := Bench(context.Background(), BenchOptions{
				Flips:     1,
				Confirm:   tc.confirm,
				SetMarker: func(context.Context, bool) error { return nil },
				Probe: func(context.Context) (bool, error) {
					if i >= len(tc.script) {
						return false, errors.New("script exhausted")
					}
					i++
					return tc.script[i-1], nil
				},
				FlipTimeout: 5 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Samples) != 1 || res.Samples[0].Probes != tc.probes || i != len(tc.script) {
				t.Errorf("samples %+v after %d probes, want one with %d probes after %d", res.Samples, i, tc.probes, len(tc.script))
			}
		})
	}
}
