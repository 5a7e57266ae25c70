package testvm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestObjScanner: the proxy's stream splitter finds top-level objects
// across reads, ignores braces inside strings and resets on 0xFF.
func TestObjScanner(t *testing.T) {
	for _, tt := range []struct {
		name   string
		chunks []string
		want   []string // objects, in order; "~" prefixes bytes between them
	}{
		{"one", []string{`{"execute":"guest-ping"}` + "\n"}, []string{`{"execute":"guest-ping"}`, "~\n"}},
		{"split", []string{`{"execute":"gu`, `est-ping"}`}, []string{`{"execute":"guest-ping"}`}},
		{"braces in strings", []string{`{"a":"}{\"}","b":{"c":1}}{}`}, []string{`{"a":"}{\"}","b":{"c":1}}`, `{}`}},
		{"delimiter", []string{"\xff{\"execute\":\"guest-sync-delimited\"}"}, []string{"~\xff", `{"execute":"guest-sync-delimited"}`}},
		{"reset", []string{"{\"execute\":\"gue\xff{}"}, []string{"~\xff", "{}"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s objScanner
			var got []string
			n := 0
			for _, c := range tt.chunks {
				n += s.feed([]byte(c), func(chunk []byte, obj bool) {
					if obj {
						got = append(got, string(chunk))
					} else {
						got = append(got, "~"+string(chunk))
					}
				})
			}
			objs := 0
			for _, w := range tt.want {
				if !strings.HasPrefix(w, "~") {
					objs++
				}
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") || n != objs {
				t.Fatalf("got %q (%d objects), want %q (%d)", got, n, tt.want, objs)
			}
			// Counting only (the agent's side of the proxy): the same
			// number of objects.
			var counter objScanner
			cn := 0
			for _, c := range tt.chunks {
				cn += counter.feed([]byte(c), nil)
			}
			if cn != objs {
				t.Fatalf("counting only: %d objects, want %d", cn, objs)
			}
		})
	}
}

// TestObjScannerCountingKeepsNothing: fed without emit (the replies
// direction, where a guest-exec-status reply carries up to 16 MiB of
// output) the scanner keeps none of an unfinished object's bytes; the
// proxy's copy of every reply made a 200 MiB streamed exec grow the test
// process by 100 MiB (e2e TestBedExec200MiB).
func TestObjScannerCountingKeepsNothing(t *testing.T) {
	var s objScanner
	chunk := []byte(`{"return":{"exited":false,"out-data":"` + strings.Repeat("A", 32<<10))
	if n := s.feed(chunk, nil); n != 0 {
		t.Fatalf("%d objects in an unfinished one", n)
	}
	for range 64 {
		s.feed([]byte(strings.Repeat("A", 32<<10)), nil)
	}
	if len(s.obj) != 0 || cap(s.obj) != 0 {
		t.Fatalf("the counting scanner keeps %d bytes", len(s.obj))
	}
	if n := s.feed([]byte(`"}}`), nil); n != 1 {
		t.Fatalf("%d objects at the end of the reply, want 1", n)
	}
}

// TestFrozenReason: qemu-ga's frozen-state reason by version.
func TestFrozenReason(t *testing.T) {
	for v, want := range map[string]string{
		"QEMU Guest Agent 7.2.22": "the agent is in frozen state",
		"QEMU Guest Agent 9.0.2":  "the agent is in frozen state",
		"QEMU Guest Agent 9.1.0":  "the command is not allowed",
		"QEMU Guest Agent 10.1.2": "the command is not allowed",
	} {
		if got := frozenReason(v); got != want {
			t.Errorf("%s: %q, want %q", v, got, want)
		}
	}
}

// TestAgentProxyFrozen: on the bed, the proxy in front of the real
// qemu-ga refuses what qemu-ga refuses while frozen, in order with the
// replies qemu-ga gives to the commands it still runs on the same
// connection, and never lets a freeze reach qemu-ga.
func TestAgentProxyFrozen(t *testing.T) {
	testkit.RequireRoot(t)
	b, ga, _ := upTwoZones(t)
	roundTrip := func(send string, replies int) []string {
		t.Helper()
		c, err := net.DialTimeout("unix", ga.Socket, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		if _, err := c.Write([]byte(send)); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		var out []string
		for len(out) < replies {
			line, err := r.ReadBytes('\n')
			if err != nil {
				t.Fatalf("after %q: %v", out, err)
			}
			out = append(out, string(bytes.TrimSpace(bytes.TrimPrefix(line, []byte{0xff}))))
		}
		return out
	}
	errClass := func(reply string) (class, desc string) {
		var r struct {
			Error struct{ Class, Desc string } `json:"error"`
		}
		_ = json.Unmarshal([]byte(reply), &r)
		return r.Error.Class, r.Error.Desc
	}

	// never a freeze, frozen or not
	if got := roundTrip(`{"execute":"guest-fsfreeze-freeze"}`+"\n"+`{"execute":"guest-fsfreeze-status"}`+"\n", 2); !strings.Contains(got[0], "does not freeze") || got[1] != `{"return":"thawed"}` {
		t.Fatalf("freeze while thawed: %q", got)
	}
	if err := b.SetAgentFrozen(ga.VMID, true); err != nil {
		t.Fatal(err)
	}
	pipelined := "\xff" + `{"execute":"guest-sync-delimited","arguments":{"id":4711}}` + "\n" +
		`{"execute":"guest-info"}` + "\n" +
		`{"execute":"guest-exec","arguments":{"path":"/bin/true"},"id":"x7"}` + "\n" +
		`{"execute":"guest-ping"}` + "\n" +
		`{"execute":"guest-fsfreeze-status"}` + "\n"
	got := roundTrip(pipelined, 6)
	if !strings.Contains(got[0], "JSON parse error") {
		t.Errorf("reply to 0xFF: %q, want qemu-ga's parse error", got[0])
	}
	got = got[1:]
	if got[0] != `{"return": 4711}` && got[0] != `{"return":4711}` {
		t.Errorf("sync: %q", got[0])
	}
	if !strings.Contains(got[1], `"supported_commands"`) {
		t.Errorf("guest-info while frozen: %q, want qemu-ga's answer", got[1])
	}
	if class, desc := errClass(got[2]); class != "CommandNotFound" || desc != "Command guest-exec has been disabled: "+b.qgaFrozenReason(context.Background()) {
		t.Errorf("guest-exec while frozen: %q, want qemu-ga's refusal", got[2])
	}
	if !strings.Contains(got[2], `"id":"x7"`) {
		t.Errorf("the refusal %q lacks the request's id (qmp_dispatch copies it)", got[2])
	}
	if !strings.Contains(got[3], `"return"`) || got[4] != `{"return":"frozen"}` {
		t.Errorf("ping, fsfreeze-status while frozen: %q, %q", got[3], got[4])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pingAgent(ctx, ga.Socket); err != nil {
		t.Errorf("the bed's own ping while frozen: %v", err)
	}
	// thaw through the agent ends the emulated state
	if got := roundTrip(`{"execute":"guest-fsfreeze-thaw"}`+"\n", 1); got[0] != `{"return":1}` {
		t.Fatalf("thaw: %q", got)
	}
	if out := rawExec(t, ga.Socket, "/bin/echo", "thawed"); strings.TrimSpace(out) != "thawed" {
		t.Fatalf("exec after the thaw: %q", out)
	}
	if err := b.SetAgentFrozen(999, true); err == nil {
		t.Error("froze a guest that does not run")
	}
}

// busyAgent listens on path with qemu-ga's backlog (unix_listen: one
// pending connection) and serves one client at a time, each for hold
// before it answers its lines with {"return":{}}.
func busyAgent(t *testing.T, path string, hold time.Duration) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), path)
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			time.Sleep(hold)
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if _, err := c.Write([]byte("{\"return\": {}}\n")); err != nil {
					break
				}
			}
			c.Close()
		}
	}()
}

// TestProxyWaitsForBusyAgent: qemu-ga serves one client and queues one
// more; a connect beyond that fails with EAGAIN. The proxy has accepted its
// clients already, so it waits for the agent as a connected client of
// QEMU's would, and never resets one (a CI run's disk transfer saw its
// execs reset for 30 s while the agent was busy).
func TestProxyWaitsForBusyAgent(t *testing.T) {
	dir := t.TempDir()
	up := filepath.Join(dir, "agent.sock")
	busyAgent(t, up, 100*time.Millisecond)
	ln, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
	if err != nil {
		t.Fatal(err)
	}
	p := startAgentProxy(ln, up, "")
	defer p.close()
	const clients = 6
	errs := make(chan error, clients)
	for range clients {
		go func() {
			c, err := net.Dial("unix", filepath.Join(dir, "proxy.sock"))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := c.Write([]byte(`{"execute":"guest-info"}` + "\n")); err != nil {
				errs <- err
				return
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil && strings.TrimSpace(line) != `{"return": {}}` {
				err = fmt.Errorf("reply %q", line)
			}
			errs <- err
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Errorf("a client of a busy agent: %v", err)
		}
	}
}

// startQemuGA runs the installed qemu-ga on a unix-listen socket in dir,
// as the bed's guests do, and returns the socket and a channel closed when
// qemu-ga exits; it is killed when the test ends.
func startQemuGA(t *testing.T, dir string) (string, <-chan struct{}) {
	t.Helper()
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command("qemu-ga", "-m", "unix-listen", "-p", sock, "-t", dir, "-f", filepath.Join(dir, "qemu-ga.pid"))
	cmd.Env = guestEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	waitPing(t, sock, exited)
	return sock, exited
}

// waitPing waits until guest-ping on sock is answered; it fails the test
// when exited is closed (qemu-ga quit) or after a minute.
func waitPing(t *testing.T, sock string, exited <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		err := pingAgent(ctx, sock)
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("qemu-ga quit (last ping: %v)", err)
		case <-ctx.Done():
			t.Fatalf("qemu-ga does not answer: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitStalled waits until c has replies queued and no more arrive: every
// socket between qemu-ga and c is full, and qemu-ga waits to write.
func waitStalled(t *testing.T, c *net.UnixConn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		n := 0
		_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return n
	}
	last, same := -1, 0
	for deadline := time.Now().Add(time.Minute); same < 10; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("replies still arriving after a minute (%d bytes queued)", last)
		}
		n := queued()
		if n > 0 && n == last {
			same++
		} else {
			same = 0
		}
		last = n
	}
}

// TestProxyClientLeavesMidReply: a client that stops sending while the
// real qemu-ga still owes it replies (a cancelled call's connection, a
// half-close before a drain) neither stops qemu-ga nor loses the replies
// it still reads. The proxy used to close its connection to qemu-ga at
// once, often with replies unread in it: that resets the connection, a
// unix-listen qemu-ga quits on the read error, and the bed's guest ended
// with it (CI: qga TestFileRoundTrip's cancelled write, e2e
// TestBedDiskTransfer).
func TestProxyClientLeavesMidReply(t *testing.T) {
	testkit.RequireRoot(t, "qemu-ga")
	// guest-info replies are about 3 KiB each: more than the sockets
	// between qemu-ga and the client hold
	const requests = 300
	for _, tt := range []struct {
		name string
		// halfClose: CloseWrite and read to EOF; else read nothing
		// until the path stalls, then Close with the replies unread
		halfClose bool
	}{
		{"closes with replies unread", false},
		{"half-closes and drains", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			agent, exited := startQemuGA(t, dir)
			ln, err := net.Listen("unix", filepath.Join(dir, "proxy.sock"))
			if err != nil {
				t.Fatal(err)
			}
			p := startAgentProxy(ln, agent, "")
			t.Cleanup(p.close)
			nc, err := net.Dial("unix", filepath.Join(dir, "proxy.sock"))
			if err != nil {
				t.Fatal(err)
			}
			c := nc.(*net.UnixConn)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := c.Write(bytes.Repeat([]byte(`{"execute":"guest-info"}`+"\n"), requests)); err != nil {
				t.Fatal(err)
			}
			if tt.halfClose {
				if err := c.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				r := bufio.NewReader(c)
				replies := 0
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						if len(line) > 0 || !errors.Is(err, io.EOF) {
							t.Fatalf("after %d replies: %v (%d bytes of a reply)", replies, err, len(line))
						}
						break
					}
					if !bytes.Contains(line, []byte(`"supported_commands"`)) {
						t.Fatalf("reply %d: %.80q", replies, line)
					}
					replies++
				}
				if replies != requests {
					t.Fatalf("%d replies before EOF, want %d", replies, requests)
				}
			} else {
				waitStalled(t, c)
				_ = c.Close()
			}
			// qemu-ga lives on and serves the next client
			waitPing(t, filepath.Join(dir, "proxy.sock"), exited)
		})
	}
}
