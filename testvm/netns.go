package testvm

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// Do runs fn with the calling goroutine locked to an OS thread that has
// joined the network namespace ns. Sockets created inside fn stay in ns after
// it returns, so a listener opened in fn serves ns from any goroutine.
func (b *Bed) Do(ns string, fn func() error) error {
	return doInNS(ns, fn)
}

func doInNS(ns string, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", ns, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return fmt.Errorf("enter netns %s: %w", ns, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread is in the wrong namespace; do not give it back to the
		// scheduler (LockOSThread without Unlock ends the thread with the
		// goroutine).
		runtime.LockOSThread()
		return fmt.Errorf("leave netns %s: %w (after: %v)", ns, err, ferr)
	}
	return ferr
}

// Command returns argv prepared to run inside network namespace ns.
func (b *Bed) Command(ctx context.Context, ns string, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
}

// run executes argv and returns an error carrying its output on failure.
func run(ctx context.Context, argv ...string) error {
	_, err := output(ctx, argv...)
	return err
}

// output executes argv and returns its standard output.
func output(ctx context.Context, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// runInput executes argv with stdin.
func runInput(ctx context.Context, stdin string, argv ...string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
