package qga

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// requireRoot skips (or, under CI, fails) tests that need root.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test needs root (real qemu-ga in its own PID and mount namespace)")
		}
		t.Skip("SKIPPED: needs root to run the real qemu-ga in its own PID and mount namespace")
	}
}

// testGuest is a real qemu-ga serving a unix socket from its own PID and
// mount namespace, with tini as its init.
//
// Throwaway launcher until the integrator's test bed (testvm) lands.
type testGuest struct {
	Socket string
	Dir    string
}

func startGuest(t testing.TB) *testGuest {
	t.Helper()
	requireRoot(t)
	for _, bin := range []string{"qemu-ga", "unshare", "tini"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s missing: %v", bin, err)
			}
			t.Skipf("SKIPPED: %s missing: %v", bin, err)
		}
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "qga.sock")
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
		"tini", "-s", "--", "qemu-ga", "-m", "unix-listen", "-p", sock, "-t", dir, "-f", filepath.Join(dir, "qga.pid"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, err := os.Create(filepath.Join(dir, "qga.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu-ga: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	c := New(Options{})
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Agent(sock).Ping(ctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "qga.log"))
			t.Fatalf("qemu-ga exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu-ga does not answer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &testGuest{Socket: sock, Dir: dir}
}
