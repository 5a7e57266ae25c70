package pveemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// FakeBackend is a Backend without root or namespaces, for unit tests: zones
// are only recorded, and a started VM gets a fake guest agent on a unix
// socket that speaks the qemu-ga wire protocol (sync-delimited, ping, exec,
// exec-status, file-open/read/write/seek/close) with the VM's disk directory
// as the guest's root. Exec is simulated: echo, cat, true and false exist;
// anything else fails like a missing binary. It is not a guest.
type FakeBackend struct {
	dir string

	mu     sync.Mutex
	zones  map[string]ZoneSpec
	guests map[int]*fakeGuest
	down   map[int]bool
	fail   map[string]error
	calls  []string
	// dhcpRestarts counts RestartDHCP calls.
	dhcpRestarts int
	// cts are the running containers' specs.
	cts map[int]CTSpec
	// frozen are the containers frozen (CTFreezer); freezeFail the
	// error a container's next freezes fail with.
	frozen     map[int]bool
	freezeFail map[int]error
}

// RestartDHCP implements DHCPRestarter: it only counts.
func (f *FakeBackend) RestartDHCP(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dhcpRestarts++
	return nil
}

// DHCPRestarts is how often the node restarted its DHCP servers.
func (f *FakeBackend) DHCPRestarts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dhcpRestarts
}

// FailZone makes ApplyZone of zone id fail with err (nil clears it).
func (f *FakeBackend) FailZone(id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		f.fail = map[string]error{}
	}
	f.fail[id] = err
}

// NewFakeBackend returns a FakeBackend whose agent sockets live in sockDir.
func NewFakeBackend(sockDir string) *FakeBackend {
	return &FakeBackend{dir: sockDir, zones: map[string]ZoneSpec{}, guests: map[int]*fakeGuest{}, down: map[int]bool{}}
}

func (f *FakeBackend) note(format string, a ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, a...))
}

// ApplyZone implements Backend.
func (f *FakeBackend) ApplyZone(_ context.Context, z ZoneSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[z.ID]; err != nil {
		return err
	}
	for _, v := range z.VNets {
		if len(v.Name) > 15 {
			return fmt.Errorf("bridge name %q too long", v.Name)
		}
	}
	f.zones[z.ID] = z
	f.note("apply-zone %s", z.ID)
	return nil
}

// RemoveZone implements Backend.
func (f *FakeBackend) RemoveZone(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.zones, id)
	f.note("remove-zone %s", id)
	return nil
}

// StartVM implements Backend.
func (f *FakeBackend) StartVM(_ context.Context, v VMSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.guests[v.VMID] != nil {
		return fmt.Errorf("guest %d already running", v.VMID)
	}
	if v.VNet != "" && !f.hasBridgeLocked(v.VNet) {
		return fmt.Errorf("bridge %s does not exist", v.VNet)
	}
	sock := f.AgentSocket(v.VMID)
	_ = os.Remove(sock)
	g := &fakeGuest{root: v.Disk, files: map[int]*os.File{}, procs: map[int]*fakeProc{}, down: func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.down[v.VMID]
	}}
	if !v.NoAgent {
		l, err := net.Listen("unix", sock)
		if err != nil {
			return fmt.Errorf("agent socket: %w", err)
		}
		g.l = l
		g.wg.Add(1)
		go g.serve()
	}
	f.guests[v.VMID] = g
	agent := ""
	if v.NoAgent {
		agent = " agent=off"
	}
	if v.IP.IsValid() {
		f.note("start %d vnet=%s mac=%s ip=%s%s", v.VMID, v.VNet, v.MAC, v.IP, agent)
	} else {
		f.note("start %d vnet=%s mac=%s%s", v.VMID, v.VNet, v.MAC, agent)
	}
	return nil
}

// HasBridge implements BridgeReporter: a zone applied here has the vnet.
func (f *FakeBackend) HasBridge(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hasBridgeLocked(name)
}

func (f *FakeBackend) hasBridgeLocked(name string) bool {
	for _, z := range f.zones {
		for _, v := range z.VNets {
			if v.Name == name {
				return true
			}
		}
	}
	return false
}

// StopVM implements Backend.
func (f *FakeBackend) StopVM(_ context.Context, vmid int) error {
	f.mu.Lock()
	g := f.guests[vmid]
	delete(f.guests, vmid)
	f.note("stop %d", vmid)
	f.mu.Unlock()
	if g != nil {
		g.close()
		_ = os.Remove(f.AgentSocket(vmid))
	}
	return nil
}

// GuestRoot is the directory a running guest's agent sees as / ("" when
// vmid is not running).
func (f *FakeBackend) GuestRoot(vmid int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if g := f.guests[vmid]; g != nil {
		return g.root
	}
	return ""
}

// AgentSocket implements Backend.
func (f *FakeBackend) AgentSocket(vmid int) string {
	return filepath.Join(f.dir, strconv.Itoa(vmid)+".qga")
}

// SetAgentDown makes the VM's agent drop every connection (true) or serve
// again (false), to test "QEMU guest agent is not running".
func (f *FakeBackend) SetAgentDown(vmid int, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down[vmid] = down
}

// Zones returns the ids of the applied zones, sorted.
func (f *FakeBackend) Zones() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sortedKeys(f.zones)
}

// Zone returns an applied zone.
func (f *FakeBackend) Zone(id string) (ZoneSpec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	z, ok := f.zones[id]
	return z, ok
}

// VNet returns the applied vnet named bridge, if a zone has it.
func (f *FakeBackend) VNet(bridge string) (VNetSpec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, z := range f.zones {
		for _, v := range z.VNets {
			if v.Name == bridge {
				return v, true
			}
		}
	}
	return VNetSpec{}, false
}

// Running returns the VMIDs of running guests, sorted.
func (f *FakeBackend) Running() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]int, 0, len(f.guests))
	for id := range f.guests {
		out = append(out, id)
	}
	sort.Ints(out)
	return out
}

// Calls returns the backend calls made so far.
func (f *FakeBackend) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// Close stops every guest.
func (f *FakeBackend) Close() error {
	for _, id := range f.Running() {
		_ = f.StopVM(context.Background(), id)
	}
	return nil
}

type fakeProc struct {
	exitcode int
	out, err []byte
}

type fakeGuest struct {
	root string
	l    net.Listener
	down func() bool
	wg   sync.WaitGroup
	// frozen is qemu-ga's frozen state (SetAgentFrozen).
	frozen atomic.Bool

	mu      sync.Mutex
	conns   map[net.Conn]bool
	files   map[int]*os.File
	procs   map[int]*fakeProc
	nextFH  int
	nextPID int
}

func (g *fakeGuest) close() {
	if g.l != nil { // a guest without an agent has no socket
		_ = g.l.Close()
	}
	g.mu.Lock()
	for c := range g.conns {
		_ = c.Close()
	}
	for _, f := range g.files {
		_ = f.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

func (g *fakeGuest) serve() {
	defer g.wg.Done()
	for {
		c, err := g.l.Accept()
		if err != nil {
			return
		}
		if g.down() {
			_ = c.Close()
			continue
		}
		g.mu.Lock()
		if g.conns == nil {
			g.conns = map[net.Conn]bool{}
		}
		g.conns[c] = true
		g.mu.Unlock()
		g.handleConn(c) // qemu-ga serves one client at a time
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
	}
}

func (g *fakeGuest) handleConn(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(io.LimitReader(c, 64<<20))
	for {
		line, err := r.ReadBytes('\n')
		line = bytes.TrimSpace(bytes.ReplaceAll(line, []byte{0xff}, nil))
		if len(line) > 0 {
			var req struct {
				Execute   string          `json:"execute"`
				Arguments json.RawMessage `json:"arguments"`
			}
			var reply []byte
			if jerr := json.Unmarshal(line, &req); jerr != nil {
				reply, _ = json.Marshal(map[string]any{"error": map[string]any{"class": "GenericError", "desc": "JSON parse error"}})
			} else {
				if req.Execute == "guest-sync-delimited" {
					_, _ = c.Write([]byte{0xff})
				}
				var ret any
				var aerr *AgentError
				if g.frozen.Load() {
					ret, aerr = g.frozenExec(req.Execute, req.Arguments)
				} else {
					ret, aerr = g.exec(req.Execute, req.Arguments)
				}
				if aerr != nil {
					reply, _ = json.Marshal(map[string]any{"error": aerr})
				} else {
					reply, _ = json.Marshal(map[string]any{"return": ret})
				}
			}
			if _, werr := c.Write(append(reply, '\n')); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// frozenExec answers command while the agent is frozen: qemu-ga's
// refusal, or the frozen state's own answers of the commands it allows
// (guest-fsfreeze-status "frozen"; guest-fsfreeze-thaw ends the state,
// as qga/commands-posix.c qmp_guest_fsfreeze_thaw does); the others it
// allows (guest-ping, guest-info, guest-sync*) run as usual.
func (g *fakeGuest) frozenExec(command string, args json.RawMessage) (any, *AgentError) {
	if e := FrozenRefusal(command); e != nil {
		return nil, e
	}
	switch command {
	case "guest-fsfreeze-status":
		return "frozen", nil
	case "guest-fsfreeze-thaw":
		g.frozen.Store(false)
		return 1, nil
	}
	return g.exec(command, args)
}

// SetAgentFrozen implements AgentFreezer.
func (f *FakeBackend) SetAgentFrozen(vmid int, frozen bool) error {
	f.mu.Lock()
	g := f.guests[vmid]
	f.mu.Unlock()
	if g == nil {
		return fmt.Errorf("fake: VM %d is not running", vmid)
	}
	g.frozen.Store(frozen)
	return nil
}

func (g *fakeGuest) path(p string) string {
	return filepath.Join(g.root, filepath.Clean("/"+p))
}

func (g *fakeGuest) exec(cmd string, raw json.RawMessage) (any, *AgentError) {
	var a struct {
		ID      int64    `json:"id"`
		Path    string   `json:"path"`
		Arg     []string `json:"arg"`
		Input   string   `json:"input-data"`
		Mode    string   `json:"mode"`
		Handle  int      `json:"handle"`
		Count   int      `json:"count"`
		Buf     string   `json:"buf-b64"`
		PID     int      `json:"pid"`
		Offset  int64    `json:"offset"`
		Whence  any      `json:"whence"`
		Capture bool     `json:"capture-output"`
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, &AgentError{Class: "GenericError", Desc: "Invalid parameter type"}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch cmd {
	case "guest-sync-delimited", "guest-sync":
		return a.ID, nil
	case "guest-ping":
		return map[string]any{}, nil
	case "guest-get-osinfo":
		return map[string]any{"id": "pveemu-fake", "name": "pveemu fake guest", "kernel-release": "0", "machine": "x86_64"}, nil
	case "guest-exec":
		g.nextPID++
		pid := 1000 + g.nextPID
		g.procs[pid] = g.simulate(a.Path, a.Arg, a.Input)
		return map[string]any{"pid": pid}, nil
	case "guest-exec-status":
		p := g.procs[a.PID]
		if p == nil {
			return nil, &AgentError{Class: "GenericError", Desc: "Invalid parameter 'pid'"}
		}
		delete(g.procs, a.PID)
		out := map[string]any{"exited": true, "exitcode": p.exitcode}
		if len(p.out) > 0 {
			out["out-data"] = base64.StdEncoding.EncodeToString(p.out)
		}
		if len(p.err) > 0 {
			out["err-data"] = base64.StdEncoding.EncodeToString(p.err)
		}
		return out, nil
	case "guest-file-open":
		flag := os.O_RDONLY
		switch strings.TrimSuffix(a.Mode, "b") {
		case "w":
			flag = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		case "a":
			flag = os.O_WRONLY | os.O_CREATE | os.O_APPEND
		case "r+", "w+":
			flag = os.O_RDWR | os.O_CREATE
		}
		f, err := os.OpenFile(g.path(a.Path), flag, 0o644)
		if err != nil {
			return nil, &AgentError{Class: "GenericError", Desc: fmt.Sprintf("failed to open file '%s' (mode: '%s'): %s", a.Path, a.Mode, errText(err))}
		}
		g.nextFH++
		g.files[g.nextFH] = f
		return g.nextFH, nil
	case "guest-file-read":
		f := g.files[a.Handle]
		if f == nil {
			return nil, &AgentError{Class: "GenericError", Desc: fmt.Sprintf("handle '%d' has not been found", a.Handle)}
		}
		count := a.Count
		if count <= 0 {
			count = 4096
		}
		buf := make([]byte, count)
		n, err := io.ReadFull(f, buf)
		eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !eof {
			return nil, &AgentError{Class: "GenericError", Desc: "failed to read file: " + errText(err)}
		}
		return map[string]any{"count": n, "buf-b64": base64.StdEncoding.EncodeToString(buf[:n]), "eof": eof}, nil
	case "guest-file-write":
		f := g.files[a.Handle]
		if f == nil {
			return nil, &AgentError{Class: "GenericError", Desc: fmt.Sprintf("handle '%d' has not been found", a.Handle)}
		}
		b, err := base64.StdEncoding.DecodeString(a.Buf)
		if err != nil {
			return nil, &AgentError{Class: "GenericError", Desc: "base64 decoding failed"}
		}
		n, err := f.Write(b)
		if err != nil {
			return nil, &AgentError{Class: "GenericError", Desc: "failed to write to file: " + errText(err)}
		}
		return map[string]any{"count": n, "eof": false}, nil
	case "guest-file-seek":
		f := g.files[a.Handle]
		if f == nil {
			return nil, &AgentError{Class: "GenericError", Desc: fmt.Sprintf("handle '%d' has not been found", a.Handle)}
		}
		pos, err := f.Seek(a.Offset, io.SeekStart)
		if err != nil {
			return nil, &AgentError{Class: "GenericError", Desc: "failed to seek file: " + errText(err)}
		}
		return map[string]any{"position": pos, "eof": false}, nil
	case "guest-file-close":
		f := g.files[a.Handle]
		if f == nil {
			return nil, &AgentError{Class: "GenericError", Desc: fmt.Sprintf("handle '%d' has not been found", a.Handle)}
		}
		delete(g.files, a.Handle)
		_ = f.Close()
		return map[string]any{}, nil
	}
	return nil, &AgentError{Class: "CommandNotFound", Desc: fmt.Sprintf("The command %s has not been found", cmd)}
}

func errText(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// simulate runs the fake guest's tiny command set.
func (g *fakeGuest) simulate(path string, args []string, input string) *fakeProc {
	stdin, _ := base64.StdEncoding.DecodeString(input)
	switch filepath.Base(path) {
	case "echo":
		return &fakeProc{out: []byte(strings.Join(args, " ") + "\n")}
	case "true":
		return &fakeProc{}
	case "false":
		return &fakeProc{exitcode: 1}
	case "cat":
		if len(args) == 0 {
			return &fakeProc{out: stdin}
		}
		var out, errb []byte
		code := 0
		for _, a := range args {
			b, err := os.ReadFile(g.path(a))
			if err != nil {
				errb = append(errb, fmt.Sprintf("cat: %s: %s\n", a, errText(err))...)
				code = 1
				continue
			}
			out = append(out, b...)
		}
		return &fakeProc{exitcode: code, out: out, err: errb}
	}
	return &fakeProc{exitcode: 127, err: []byte(fmt.Sprintf("%s: command not found\n", path))}
}
