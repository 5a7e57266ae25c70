package qga

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// envList splits `env -0` output into its entries.
func envList(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// TestExecTaggedEnv: on the real agent, the command of a direct exec sees
// exactly what qemu-ga gives a bare guest-exec plus the tag, and each exec
// gets its own tag.
func TestExecTaggedEnv(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	ctx := testCtx(t, time.Minute)
	bare, err := a.run(ctx, []string{envProgram, "-0"})
	if err != nil || bare.ExitCode != 0 {
		t.Fatalf("bare env -0: %+v %v", bare, err)
	}
	want := envList(bare.Stdout)
	if len(want) == 0 {
		t.Fatal("the agent's environment is empty; the test would prove little")
	}
	tags := map[string]bool{}
	for i := range 2 {
		res, err := a.Exec(ctx, ExecRequest{Argv: []string{"env", "-0"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %d: %+v %v", i, res, err)
		}
		got := envList(res.Stdout)
		if len(got) != len(want)+1 || !slices.Equal(got[:len(want)], want) || !tagEntry.MatchString(got[len(want)]) {
			t.Fatalf("exec %d: command saw %q, want %q plus the tag", i, got, want)
		}
		tags[got[len(want)]] = true
	}
	if len(tags) != 2 {
		t.Fatalf("two execs shared a tag: %v", tags)
	}
}

// TestExecTaggedTimeoutKillsEscapees: the tagged exec's timeout kills what
// a session and group kill misses: a background child that called setsid
// itself (holding the output), one that did so with its output
// redirected, and an orphan reparented to init; a second exec running on
// the same agent at the same time is not touched.
func TestExecTaggedTimeoutKillsEscapees(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	script := `setsid sleep 601 & setsid sh -c 'sleep 602 >/dev/null 2>&1' & (sleep 603 >/dev/null 2>&1 &); sleep 600`
	var wg sync.WaitGroup
	var other *ExecResult
	var otherErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		other, otherErr = a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"sh", "-c", "sleep 5; echo survived"}, Timeout: 30 * time.Second})
	}()
	start := time.Now()
	res, err := a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 2 * time.Second})
	took := time.Since(start)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timed out after %v", took)
	if !res.TimedOut || res.Signal != 9 || res.ExitCode != 137 || took > 10*time.Second {
		t.Fatalf("got %+v after %v, want timed out with SIGKILL", res, took)
	}
	if otherErr != nil || other.ExitCode != 0 || other.TimedOut || string(other.Stdout) != "survived\n" {
		t.Fatalf("the concurrent exec: %+v stdout %q, %v; want it untouched", other, other.Stdout, otherErr)
	}
	if !guestHasNo(t, a, "sleep") {
		t.Fatal("sleep processes survived the timeout")
	}
}

// TestExecTaggedCancelWhileCapturing: an exec whose context ends while it
// waits for another caller's capture of the environment gives up with
// the context's error.
func TestExecTaggedCancelWhileCapturing(t *testing.T) {
	t.Parallel()
	e := newExecAgent(t, `{"exited": true, "exitcode": 0}`)
	a := New(hostileOptions()).Agent(e.Socket)
	entry := a.c.envs.entry(a.socket)
	entry.fill <- struct{}{} // a capture under way
	defer func() { <-entry.fill }()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := a.Exec(ctx, ExecRequest{Argv: []string{"x"}}); err == nil || ctx.Err() == nil {
		t.Fatalf("got %v, want the context's error", err)
	}
	if got := e.calls(); len(got) != 0 {
		t.Fatalf("started %q while the capture was held", paths(got))
	}
}
