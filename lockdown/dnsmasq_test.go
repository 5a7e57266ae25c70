package lockdown

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// standInEnv makes the test binary act as a stand-in dnsmasq: it records
// every SIGHUP as a line in the file the variable names.
const standInEnv = "LOCKDOWN_TEST_STANDIN_RECORD"

func TestMain(m *testing.M) {
	if rec := os.Getenv(standInEnv); rec != "" {
		runStandIn(rec)
		return
	}
	os.Exit(m.Run())
}

func runStandIn(rec string) {
	hup := make(chan os.Signal, 16)
	signal.Notify(hup, syscall.SIGHUP)
	if err := os.WriteFile(rec+".ready", nil, 0o644); err != nil {
		os.Exit(2)
	}
	for range hup {
		f, err := os.OpenFile(rec, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			os.Exit(2)
		}
		fmt.Fprintln(f, "HUP")
		f.Close()
	}
}

func TestMatcher(t *testing.T) {
	m := DnsmasqMatcher{CmdlineContains: []string{"/etc/dnsmasq.d/", "/run/dnsmasq/resolv.conf"}}
	for _, tc := range []struct {
		exe  string
		argv []string
		want bool
	}{
		{"/usr/sbin/dnsmasq", []string{"/usr/sbin/dnsmasq", "--conf-dir=/etc/dnsmasq.d/zone1"}, true},
		{"/usr/sbin/dnsmasq (deleted)", []string{"dnsmasq", "-7", "/etc/dnsmasq.d/zone1,.dpkg-dist"}, true},
		{"dnsmasq", []string{"dnsmasq", "-r", "/run/dnsmasq/resolv.conf"}, true},
		{"/usr/sbin/dnsmasq", []string{"/usr/sbin/dnsmasq", "--conf-file=/etc/dnsmasq.conf"}, false}, // not SDN
		{"/usr/bin/sleep", []string{"sleep", "/etc/dnsmasq.d/zone1"}, false},                         // not dnsmasq
		{"/usr/sbin/dnsmasq-helper", []string{"x", "/etc/dnsmasq.d/"}, false},
		{"", []string{"dnsmasq", "/etc/dnsmasq.d/"}, false},
		{"/usr/sbin/dnsmasq", nil, false},
	} {
		if got := m.Match(tc.exe, tc.argv); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.exe, tc.argv, got, tc.want)
		}
	}
	if (DnsmasqMatcher{}).Match("/usr/sbin/dnsmasq", []string{"dnsmasq", "/etc/dnsmasq.d/x"}) {
		t.Error("a matcher without substrings matched")
	}
	d := DefaultMatcher("/run/x/resolv.conf")
	if !d.Match("/usr/sbin/dnsmasq", []string{"dnsmasq", "--resolv-file=/run/x/resolv.conf"}) {
		t.Error("default matcher misses the resolver path")
	}
}

func TestParseCmdline(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"\x00", nil},
		{"dnsmasq\x00-k\x00", []string{"dnsmasq", "-k"}},
		{"a\x00\x00b\x00", []string{"a", "", "b"}},
		{"no-nul", []string{"no-nul"}},
	} {
		got := ParseCmdline([]byte(tc.in))
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || len(got) != len(tc.want) {
			t.Errorf("ParseCmdline(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add([]byte("dnsmasq\x00--conf-dir=/etc/dnsmasq.d/z\x00"))
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		argv := ParseCmdline(raw)
		if strings.Join(argv, "\x00") != strings.TrimRight(string(raw), "\x00") {
			t.Errorf("ParseCmdline(%q) = %q does not round-trip", raw, argv)
		}
		DefaultMatcher("/run/dnsmasq/resolv.conf").Match("/usr/sbin/dnsmasq", argv)
	})
}

// startProc starts argv (with env) and returns a func reporting whether it
// has exited; it is killed at the end of the test.
func startProc(t *testing.T, env []string, argv ...string) (*exec.Cmd, func() bool) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// Stdout and stderr stay nil (/dev/null): a pipe would make Wait wait
	// for grandchildren holding it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// The whole process group: the shell's sleep too.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	return cmd, func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hups(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "HUP\n")
}

// TestProcSignalerOnlyMatching starts a stand-in dnsmasq (a copy of the
// test binary named dnsmasq) whose command line names this run's resolver
// path, a second stand-in that does not name it, and a shell (not dnsmasq)
// that does. Only the first may get SIGHUP.
func TestProcSignalerOnlyMatching(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dnsmasq")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	resolver := filepath.Join(dir, "run", "resolv.conf") // unique per run
	recMatch := filepath.Join(dir, "match.rec")
	recOther := filepath.Join(dir, "other.rec")
	startProc(t, []string{standInEnv + "=" + recMatch}, bin, "--resolv-file="+resolver, "--keep-in-foreground")
	startProc(t, []string{standInEnv + "=" + recOther}, bin, "--resolv-file="+filepath.Join(dir, "elsewhere.conf"))
	_, shExited := startProc(t, nil, "/bin/sh", "-c", "sleep 600; true", resolver)
	waitFile(t, recMatch+".ready")
	waitFile(t, recOther+".ready")

	p := ProcSignaler{Matcher: DnsmasqMatcher{Exe: "dnsmasq", CmdlineContains: []string{resolver}}}
	n, err := p.Reload(context.Background())
	if err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if n != 1 {
		t.Errorf("signalled %d processes, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for hups(recMatch) < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := hups(recMatch); got != 1 {
		t.Errorf("matching stand-in got %d SIGHUPs, want 1", got)
	}
	// The non-matching ones had as long as the matching one to react.
	if got := hups(recOther); got != 0 {
		t.Errorf("stand-in with another resolver got %d SIGHUPs, want 0", got)
	}
	if shExited() {
		t.Error("the shell naming the resolver path was signalled (it died)")
	}

	// An empty matcher signals nothing.
	if n, err := (ProcSignaler{}).Reload(context.Background()); n != 0 || err != nil {
		t.Errorf("empty matcher: Reload = %d, %v; want 0, nil", n, err)
	}
}

// TestProcSignalerNoMatch: nothing matching is not an error, and a
// cancelled context stops the scan.
func TestProcSignalerNoMatch(t *testing.T) {
	p := ProcSignaler{Matcher: DnsmasqMatcher{CmdlineContains: []string{"/nonexistent/" + t.Name()}}}
	n, err := p.Reload(context.Background())
	if n != 0 || err != nil {
		t.Errorf("Reload = %d, %v; want 0, nil", n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Reload(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Reload with a cancelled context = %v, want context.Canceled", err)
	}
}
