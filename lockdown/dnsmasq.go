package lockdown

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DnsmasqMatcher decides which processes are SDN dnsmasq instances. See the
// package documentation for the rules.
type DnsmasqMatcher struct {
	// Exe is the executable's base name; "" means "dnsmasq".
	Exe string
	// CmdlineContains: one command-line argument must contain one of these
	// substrings. Empty matches nothing (no process is signalled).
	CmdlineContains []string
}

// DefaultMatcher matches dnsmasq processes whose command line names the
// Proxmox SDN configuration directory (/etc/dnsmasq.d/) or the resolver
// file.
func DefaultMatcher(resolver string) DnsmasqMatcher {
	return DnsmasqMatcher{Exe: "dnsmasq", CmdlineContains: []string{"/etc/dnsmasq.d/", resolver}}
}

// Match reports whether a process with executable exe (a path or a base
// name) and argument vector argv is one to signal.
func (m DnsmasqMatcher) Match(exe string, argv []string) bool {
	want := m.Exe
	if want == "" {
		want = "dnsmasq"
	}
	exe = strings.TrimSuffix(exe, " (deleted)")
	if exe == "" || filepath.Base(exe) != want {
		return false
	}
	for _, a := range argv {
		for _, s := range m.CmdlineContains {
			if s != "" && strings.Contains(a, s) {
				return true
			}
		}
	}
	return false
}

// ProcSignaler finds the matching processes in /proc and signals them. It
// pins each process with a pidfd before checking it, so a recycled pid is
// never signalled.
// It always reads the real /proc: pids from any other tree would name the
// wrong processes.
type ProcSignaler struct {
	Matcher DnsmasqMatcher // which processes
	Signal  syscall.Signal // 0 = SIGHUP
}

// Reload signals every matching process and returns how many it signalled.
// A process that exits meanwhile is skipped; any other failure is an error
// (after the remaining processes were tried).
func (p ProcSignaler) Reload(ctx context.Context) (int, error) {
	const proc = "/proc"
	sig := p.Signal
	if sig == 0 {
		sig = syscall.SIGHUP
	}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	self := os.Getpid()
	n := 0
	var errs []error
	for _, e := range ents {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == self {
			continue
		}
		ok, err := p.signal(proc, pid, sig)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// signal checks one process and signals it when it matches.
func (p ProcSignaler) signal(proc string, pid int, sig syscall.Signal) (bool, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false, nil // gone, or not a process
	}
	defer unix.Close(fd)
	exe, argv, err := readProc(proc, pid)
	if err != nil {
		return false, nil // exited meanwhile, or a kernel thread
	}
	if !p.Matcher.Match(exe, argv) {
		return false, nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("signal dnsmasq pid %d: %w", pid, err)
	}
	return true, nil
}

// readProc returns a process's executable (exe, or comm when exe cannot be
// read) and its argument vector.
func readProc(proc string, pid int) (string, []string, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	raw, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return "", nil, err
	}
	argv := ParseCmdline(raw)
	if len(argv) == 0 {
		return "", nil, errors.New("no command line")
	}
	exe, err := os.Readlink(filepath.Join(dir, "exe"))
	if err != nil {
		comm, cerr := os.ReadFile(filepath.Join(dir, "comm"))
		if cerr != nil {
			return "", nil, cerr
		}
		exe = strings.TrimSpace(string(comm))
	}
	return exe, argv, nil
}

// ParseCmdline splits the contents of /proc/PID/cmdline (NUL-terminated
// arguments) into arguments.
func ParseCmdline(raw []byte) []string {
	raw = bytes.TrimRight(raw, "\x00")
	if len(raw) == 0 {
		return nil
	}
	parts := bytes.Split(raw, []byte{0})
	argv := make([]string, len(parts))
	for i, p := range parts {
		argv[i] = string(p)
	}
	return argv
}
