// Package deathsig starts child processes that get a signal when this
// process dies, and not before.
//
// Linux sends a child its parent-death signal (PR_SET_PDEATHSIG, Go's
// SysProcAttr.Pdeathsig) when the thread that forked it exits, not when
// the process does. The Go runtime ends a thread whenever a goroutine that
// locked it (runtime.LockOSThread, as every network-namespace switch does)
// returns without unlocking, and the scheduler may have forked a child on
// that very thread moments before, for another goroutine. Such a child is
// killed at a random moment while its parent lives on: a test bed's guest
// died mid-test that way (its agent gone, "connection reset by peer").
// Start forks on a thread locked for the child's whole life, which no
// other goroutine can lock or end.
package deathsig

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
)

// Start starts cmd with sig as its parent-death signal and returns a
// channel that receives cmd.Wait's result once the child has exited. The
// caller must not call cmd.Wait itself. A nil sig leaves the signal unset.
func Start(cmd *exec.Cmd, sig syscall.Signal) (<-chan error, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	started := make(chan error, 1)
	done := make(chan error, 1)
	// The goroutine is the child's owner: it lives exactly as long as the
	// child, and holds its thread until the child is reaped.
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return done, nil
}
