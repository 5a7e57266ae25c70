// Package wintest is a fake of qemu-ga's Windows build for tests: it
// listens on a unix socket, speaks the agent's framing (0xFF answered
// with a parse error, guest-sync-delimited with 0xFF and the id) and
// answers guest-exec, guest-exec-status and the guest-file-* commands
// as the Windows agent does (QEMU qga/commands.c and commands-win32.c):
// pids are Windows process ids, output comes as base64 only once the
// process ended, an exit status of 0xC0000000 or more is reported as a
// (negative) "signal", file errors carry Windows' system messages.
//
// Its guest has a small file system (case-insensitive paths, C:\,
// C:\Windows, C:\Windows\Temp and C:\Users to start with) and a few
// programs (Programs); cmd.exe runs the batch files the client writes
// (the shapes it knows: the cwd-and-command-line script, the shell
// string script, mkdir, move and del), and taskkill.exe kills a running
// process.
package wintest

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Faults make the fake misbehave.
type Faults struct {
	// SyncDrops is how many of the next syncs are answered by closing
	// the connection (the flaky channel).
	SyncDrops int
	// SharingViolations is how many of the next guest-file-opens fail
	// with a sharing violation.
	SharingViolations int
	// StatusGarbage answers guest-exec-status with a wrongly typed reply.
	StatusGarbage bool
	// DataWhileRunning puts out-data on a status of a running process.
	DataWhileRunning bool
	// StatusOutput, when set, replaces the out-data of every finished
	// status (an agent sending more than asked).
	StatusOutput []byte
	// ExecError, when set, is the error every guest-exec answers, of
	// class ExecErrorClass (default GenericError).
	ExecError, ExecErrorClass string
}

// Exec is one guest-exec the fake received.
type Exec struct {
	Path  string
	Arg   []string
	Env   []string
	Input []byte
	// Script is the batch file cmd.exe ran, when it ran one; Body is the
	// one it ran from there with call (a shell string's).
	Script, Body string
}

// Getenv returns the value of name in e's environment (names without
// case, as on Windows).
func (e *Exec) Getenv(name string) string {
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// Result is how a program ends: Running programs end only when killed.
type Result struct {
	Out, Err []byte
	Code     int
	Running  bool
}

// Program runs argv (argv[0] as given) in cwd for e.
type Program func(a *Agent, e *Exec, argv []string, cwd string) Result

type proc struct {
	res  Result
	done bool
}

type handle struct {
	path string
	pos  int
	w    bool
}

// Agent is the fake. Its exported fields are set before use; the rest is
// read through its methods.
type Agent struct {
	Socket string
	// Programs run by lower-case base name (echo.exe, ...); New sets a
	// few (see New).
	Programs map[string]Program

	mu      sync.Mutex
	faults  Faults
	files   map[string][]byte // by lower-case path
	names   map[string]string // lower-case path: the path as created
	dirs    map[string]bool
	procs   map[int]*proc
	nextPID int
	handles map[int64]*handle
	nextH   int64
	execs   []Exec
	killed  []int
}

// New starts a fake on a socket in t's temp dir; it stops with t.
func New(t testing.TB) *Agent {
	t.Helper()
	a := &Agent{Socket: filepath.Join(t.TempDir(), "win.qga"), files: map[string][]byte{}, names: map[string]string{},
		dirs: map[string]bool{}, procs: map[int]*proc{}, nextPID: 4000, handles: map[int64]*handle{}, nextH: 1000}
	for _, d := range []string{`C:\`, `C:\Windows`, `C:\Windows\Temp`, `C:\Users`} {
		a.dirs[strings.ToLower(d)] = true
	}
	a.Programs = map[string]Program{
		// echo.exe prints its arguments, one per line (to see them split)
		"echo.exe": func(_ *Agent, _ *Exec, argv []string, _ string) Result {
			var b bytes.Buffer
			for _, s := range argv[1:] {
				b.WriteString(s + "\r\n")
			}
			return Result{Out: b.Bytes()}
		},
		// env.exe prints its environment, pwd.exe its working directory
		"env.exe": func(_ *Agent, e *Exec, _ []string, _ string) Result {
			return Result{Out: []byte(strings.Join(e.Env, "\r\n") + "\r\n")}
		},
		"pwd.exe": func(_ *Agent, _ *Exec, _ []string, cwd string) Result { return Result{Out: []byte(cwd + "\r\n")} },
		// cat.exe copies its stdin
		"cat.exe": func(_ *Agent, e *Exec, _ []string, _ string) Result { return Result{Out: e.Input} },
		// sleep.exe runs until killed
		"sleep.exe": func(*Agent, *Exec, []string, string) Result { return Result{Running: true} },
		// big.exe N prints N bytes on each stream
		"big.exe": func(_ *Agent, _ *Exec, argv []string, _ string) Result {
			n, _ := strconv.Atoi(argv[1])
			return Result{Out: bytes.Repeat([]byte("o"), n), Err: bytes.Repeat([]byte("e"), n)}
		},
		// exit.exe N exits with N (0xC0000005 and up: an NTSTATUS)
		"exit.exe": func(_ *Agent, _ *Exec, argv []string, _ string) Result {
			n, _ := strconv.ParseInt(argv[1], 0, 64)
			return Result{Code: int(int32(uint32(n)))}
		},
	}
	ln, err := net.Listen("unix", a.Socket)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); a.serve(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return a
}

// SetFaults replaces the faults.
func (a *Agent) SetFaults(f Faults) { a.mu.Lock(); a.faults = f; a.mu.Unlock() }

// Mkdir makes directory p (and its parents).
func (a *Agent) Mkdir(p string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mkdirLocked(p)
}

func (a *Agent) mkdirLocked(p string) {
	for q := p; len(q) > 3; q = parent(q) {
		a.dirs[strings.ToLower(q)] = true
	}
}

// File returns the content of guest file p.
func (a *Agent) File(p string) ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[strings.ToLower(p)]
	return slices.Clone(b), ok
}

// SetFile writes guest file p (its directory must exist).
func (a *Agent) SetFile(p string, b []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.files[strings.ToLower(p)], a.names[strings.ToLower(p)] = slices.Clone(b), p
}

// Files lists the guest files' paths.
func (a *Agent) Files() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for k := range a.files {
		out = append(out, a.names[k])
	}
	slices.Sort(out)
	return out
}

// Execs returns the guest-execs received so far.
func (a *Agent) Execs() []Exec { a.mu.Lock(); defer a.mu.Unlock(); return slices.Clone(a.execs) }

// Killed returns the pids taskkill killed.
func (a *Agent) Killed() []int { a.mu.Lock(); defer a.mu.Unlock(); return slices.Clone(a.killed) }

// Running returns the number of processes still running.
func (a *Agent) Running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, p := range a.procs {
		if !p.done {
			n++
		}
	}
	return n
}

func parent(p string) string {
	i := strings.LastIndexByte(p, '\\')
	if i <= 2 {
		return p[:3]
	}
	return p[:i]
}

type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func (a *Agent) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(line, 0xFF); i >= 0 {
			c.Write([]byte(`{"error": {"class": "GenericError", "desc": "JSON parse error"}}` + "\n"))
			line = line[i+1:]
		}
		var req request
		if json.Unmarshal(line, &req) != nil {
			c.Write([]byte(`{"error": {"class": "GenericError", "desc": "JSON parse error"}}` + "\n"))
			continue
		}
		if req.Execute == "guest-sync-delimited" {
			var s struct {
				ID json.RawMessage `json:"id"`
			}
			json.Unmarshal(req.Arguments, &s)
			a.mu.Lock()
			drop := a.faults.SyncDrops > 0
			if drop {
				a.faults.SyncDrops--
			}
			a.mu.Unlock()
			if drop {
				return
			}
			c.Write([]byte("\xff{\"return\": " + string(s.ID) + "}\n"))
			continue
		}
		ret, raw, errDesc := a.dispatch(req.Execute, req.Arguments)
		var out string
		switch {
		case errDesc != "":
			d, _ := json.Marshal(errDesc)
			class := "GenericError"
			a.mu.Lock()
			if req.Execute == "guest-exec" && a.faults.ExecErrorClass != "" {
				class = a.faults.ExecErrorClass
			}
			a.mu.Unlock()
			out = `{"error": {"class": "` + class + `", "desc": ` + string(d) + `}, "id": ` + string(req.ID) + "}"
		case raw != "":
			out = `{"return": ` + raw + `, "id": ` + string(req.ID) + "}"
		default:
			b, _ := json.Marshal(ret)
			out = `{"return": ` + string(b) + `, "id": ` + string(req.ID) + "}"
		}
		if _, err := c.Write([]byte(out + "\n")); err != nil {
			return
		}
	}
}

// dispatch answers one command: a value to marshal, a raw JSON value, or
// an error description.
func (a *Agent) dispatch(cmd string, args json.RawMessage) (any, string, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch cmd {
	case "guest-ping":
		return struct{}{}, "", ""
	case "guest-exec":
		return a.exec(args)
	case "guest-exec-status":
		return a.status(args)
	case "guest-file-open", "guest-file-read", "guest-file-write", "guest-file-seek", "guest-file-close":
		return a.file(cmd, args)
	}
	return nil, "", "The command " + cmd + " has not been found"
}

func (a *Agent) exec(args json.RawMessage) (any, string, string) {
	var r struct {
		Path    string   `json:"path"`
		Arg     []string `json:"arg"`
		Env     []string `json:"env"`
		Input   []byte   `json:"input-data"`
		Capture bool     `json:"capture-output"`
	}
	if err := json.Unmarshal(args, &r); err != nil {
		return nil, "", "Invalid parameter type: " + err.Error()
	}
	e := Exec{Path: r.Path, Arg: r.Arg, Env: r.Env, Input: r.Input}
	if a.faults.ExecError != "" {
		return nil, "", a.faults.ExecError
	}
	argv := append([]string{r.Path}, r.Arg...)
	var res Result
	switch base := strings.ToLower(r.Path[strings.LastIndexAny(r.Path, `\/`)+1:]); base {
	case "cmd.exe":
		res = a.cmd(&e, argv)
	case "taskkill.exe":
		res = a.taskkill(argv)
	default:
		prog := a.Programs[base]
		if prog == nil {
			a.execs = append(a.execs, e)
			return nil, "", fmt.Sprintf("Guest agent command failed, error was 'Failed to execute child process “%s” (No such file or directory)'", r.Path)
		}
		res = prog(a, &e, argv, `C:\Windows\system32`)
	}
	a.execs = append(a.execs, e)
	a.nextPID += 4
	a.procs[a.nextPID] = &proc{res: res, done: !res.Running}
	return map[string]int{"pid": a.nextPID}, "", ""
}

func (a *Agent) status(args json.RawMessage) (any, string, string) {
	var r struct {
		PID int `json:"pid"`
	}
	json.Unmarshal(args, &r)
	p := a.procs[r.PID]
	if p == nil {
		return nil, "", "Invalid parameter 'pid'"
	}
	switch {
	case a.faults.StatusGarbage:
		return nil, `{"exited": "yes"}`, ""
	case !p.done && a.faults.DataWhileRunning:
		return nil, `{"exited": false, "out-data": "aGk="}`, ""
	case !p.done:
		return nil, `{"exited": false}`, ""
	}
	delete(a.procs, r.PID)
	out := map[string]any{"exited": true}
	if uint32(int32(p.res.Code)) >= 0xC0000000 {
		out["signal"] = p.res.Code
	} else {
		out["exitcode"] = p.res.Code
	}
	stdout := p.res.Out
	if a.faults.StatusOutput != nil {
		stdout = a.faults.StatusOutput
	}
	for k, b := range map[string][]byte{"out": stdout, "err": p.res.Err} {
		const agentCap = 16 << 20
		if len(b) > agentCap {
			b, out[k+"-truncated"] = b[:agentCap], true
		}
		if len(b) > 0 {
			out[k+"-data"] = base64.StdEncoding.EncodeToString(b)
		}
	}
	return out, "", ""
}

// taskkill kills /PID n's process (the fake has no process tree).
func (a *Agent) taskkill(argv []string) Result {
	i := slices.IndexFunc(argv, func(s string) bool { return strings.EqualFold(s, "/PID") })
	if i < 0 || i+1 >= len(argv) || !slices.ContainsFunc(argv, func(s string) bool { return strings.EqualFold(s, "/T") }) {
		return Result{Err: []byte("ERROR: Invalid syntax.\r\n"), Code: 1}
	}
	pid, _ := strconv.Atoi(argv[i+1])
	p := a.procs[pid]
	if p == nil || p.done {
		return Result{Err: []byte(fmt.Sprintf("ERROR: The process \"%d\" not found.\r\n", pid)), Code: 128}
	}
	p.done, p.res = true, Result{Code: 1}
	a.killed = append(a.killed, pid)
	return Result{Out: []byte(fmt.Sprintf("SUCCESS: The process with PID %d has been terminated.\r\n", pid))}
}

// winErr is a Windows system error as qemu-ga reports it.
func winErr(op, p, msg string, code int) string {
	return fmt.Sprintf("%s '%s': %s (error: %x)", op, p, msg, code)
}

const (
	msgNoFile = "The system cannot find the file specified."
	msgNoPath = "The system cannot find the path specified."
	msgDenied = "Access is denied."
	msgShared = "The process cannot access the file because it is being used by another process."
)

func (a *Agent) file(cmd string, args json.RawMessage) (any, string, string) {
	var r struct {
		Path   string `json:"path"`
		Mode   string `json:"mode"`
		Handle int64  `json:"handle"`
		Count  int    `json:"count"`
		Buf    []byte `json:"buf-b64"`
		Offset int    `json:"offset"`
		Whence string `json:"whence"`
	}
	if err := json.Unmarshal(args, &r); err != nil {
		return nil, "", "Invalid parameter type: " + err.Error()
	}
	if cmd == "guest-file-open" {
		return a.open(r.Path, r.Mode)
	}
	h := a.handles[r.Handle]
	if h == nil {
		return nil, "", fmt.Sprintf("handle '%d' has not been found", r.Handle)
	}
	data := a.files[h.path]
	switch cmd {
	case "guest-file-read":
		n := min(r.Count, len(data)-h.pos)
		b := data[h.pos : h.pos+n]
		h.pos += n
		return map[string]any{"count": n, "buf-b64": base64.StdEncoding.EncodeToString(b), "eof": h.pos >= len(data)}, "", ""
	case "guest-file-write":
		if !h.w {
			return nil, "", winErr("failed to write to file", h.path, msgDenied, 5)
		}
		a.files[h.path] = append(data[:h.pos], r.Buf...)
		h.pos += len(r.Buf)
		return map[string]any{"count": len(r.Buf), "eof": false}, "", ""
	case "guest-file-seek":
		switch r.Whence {
		case "set":
			h.pos = r.Offset
		case "end":
			h.pos = len(data) + r.Offset
		}
		return map[string]any{"position": h.pos, "eof": false}, "", ""
	}
	delete(a.handles, r.Handle)
	return struct{}{}, "", ""
}

func (a *Agent) open(p, mode string) (any, string, string) {
	if a.faults.SharingViolations > 0 {
		a.faults.SharingViolations--
		return nil, "", winErr("failed to open file", p, msgShared, 0x20)
	}
	k := strings.ToLower(p)
	switch {
	case strings.Contains(p, "/") || len(p) < 3 || p[1] != ':':
		return nil, "", winErr("failed to open file", p, "The filename, directory name, or volume label syntax is incorrect.", 0x7b)
	case a.dirs[k]:
		return nil, "", winErr("failed to open file", p, msgDenied, 5)
	case !a.dirs[strings.ToLower(parent(p))]:
		return nil, "", winErr("failed to open file", p, msgNoPath, 3)
	}
	w := strings.HasPrefix(mode, "w") || strings.HasPrefix(mode, "a")
	if _, ok := a.files[k]; !ok && !w {
		return nil, "", winErr("failed to open file", p, msgNoFile, 2)
	}
	if strings.HasPrefix(mode, "w") {
		a.files[k], a.names[k] = []byte{}, p
	}
	a.nextH++
	a.handles[a.nextH] = &handle{path: k, w: w}
	return a.nextH, "", ""
}
