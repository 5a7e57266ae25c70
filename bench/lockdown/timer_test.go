package lockdown

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/lockdown"
)

// TestTimer: the target follows the marker only at the timer's runs (once
// at the start, then every period), both ways.
func TestTimer(t *testing.T) {
	d := t.TempDir()
	tm := Timer{Marker: filepath.Join(d, "marker"), Target: filepath.Join(d, "target"), Period: 200 * time.Millisecond}
	if err := lockdown.SetMarker(tm.Marker, true); err != nil {
		t.Fatal(err)
	}
	if err := lockdown.SetMarker(tm.Target, false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tm.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitTarget := func(want bool) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < 5*time.Second {
			if got, _ := lockdown.MarkerPresent(tm.Target); got == want {
				return time.Since(start)
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("target never became present=%v", want)
		return 0
	}
	waitTarget(true) // the first run at the start
	for _, on := range []bool{false, true, false} {
		// Right after a run, so the next one is a period away.
		time.Sleep(5 * time.Millisecond)
		if err := lockdown.SetMarker(tm.Marker, on); err != nil {
			t.Fatal(err)
		}
		if got, _ := lockdown.MarkerPresent(tm.Target); got == on {
			t.Fatalf("target present=%v at once, before the timer ran", got)
		}
		if took := waitTarget(on); took > 2*time.Second {
			t.Errorf("marker %v reached the target after %v, period %v", on, took, tm.Period)
		}
	}
}

func TestTimerErrors(t *testing.T) {
	d := t.TempDir()
	for _, tc := range []struct {
		name string
		tm   Timer
	}{
		{"no period", Timer{Marker: filepath.Join(d, "m"), Target: filepath.Join(d, "t")}},
		{"target dir missing", Timer{Marker: filepath.Join(d, "m"), Target: filepath.Join(d, "missing", "t"), Period: time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.tm.Period > 0 {
				// a marker present, so the first run has to create the target
				if err := os.WriteFile(tc.tm.Marker, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.tm.Run(context.Background()); err == nil {
				t.Error("Run succeeded")
			}
		})
	}
}
