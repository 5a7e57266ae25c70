package deathsig

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// init keeps the main goroutine on the main thread, so no test goroutine
// runs there: the runtime never ends the main thread (a goroutine that
// returns locked to it wedges it instead), and the test needs the thread
// it locks to end.
func init() { runtime.LockOSThread() }

// TestChildOutlivesTheThreadThatAsked starts two children from a goroutine
// that locks its thread and returns without unlocking it (the runtime ends
// that thread): one with a bare Pdeathsig, which the thread's end kills,
// and one through Start, which must live on.
func TestChildOutlivesTheThreadThatAsked(t *testing.T) {
	type started struct {
		bare, ours *exec.Cmd
		bareDone   chan error
		oursDone   <-chan error
		err        error
	}
	got := make(chan started, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		s := started{bare: exec.Command("sleep", "600"), ours: exec.Command("sleep", "600"), bareDone: make(chan error, 1)}
		s.bare.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if s.err = s.bare.Start(); s.err == nil {
			go func() { s.bareDone <- s.bare.Wait() }()
			s.oursDone, s.err = Start(s.ours, syscall.SIGKILL)
		}
		got <- s
	}()
	s := <-got
	if s.err != nil {
		t.Fatal(s.err)
	}
	t.Cleanup(func() {
		for _, c := range []*exec.Cmd{s.bare, s.ours} {
			if c.Process != nil {
				_ = c.Process.Kill()
			}
		}
		if s.oursDone != nil {
			<-s.oursDone
		}
	})
	// The bare child dies when the locked thread ends: that is the hazard.
	select {
	case err := <-s.bareDone:
		if ws, ok := s.bare.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the bare child ended by %v, want SIGKILL from its thread's end", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the bare child still runs 30 s after its thread's goroutine returned locked; the hazard this package avoids did not show")
	}
	// The bare child's death means the thread has ended, and the kernel
	// signalled every child forked on it in the same pass; a killed child
	// of ours is reaped within moments.
	select {
	case err := <-s.oursDone:
		s.oursDone = nil
		t.Fatalf("the child started through Start ended with its caller's thread: %v", err)
	case <-time.After(2 * time.Second):
	}
	// And it is still reaped through the channel.
	_ = s.ours.Process.Kill()
	select {
	case <-s.oursDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the killed child was not reaped")
	}
	s.oursDone = nil
}

func TestStartReportsFailure(t *testing.T) {
	if _, err := Start(exec.Command("/nonexistent/program"), syscall.SIGKILL); err == nil {
		t.Fatal("a program that does not exist started")
	}
}
