// Package nsrun runs a function inside a network namespace without moving
// the caller: the function runs on a goroutine of its own, locked to an OS
// thread that enters the namespace. Sockets it opens and /proc/sys/net
// files it touches belong to that namespace.
package nsrun

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn with its thread in ns and returns fn's error; a nil ns runs
// fn right here. When the thread cannot go back to its own namespace, it
// stays locked and ends with the goroutine, so no other goroutine ever
// runs in the wrong namespace.
func Do(ns *netns.NsHandle, fn func() error) error {
	if ns == nil {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(*ns); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("leave netns: %w", err))
			return // the thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}
