package pveemu

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// task is a worker like PVE::RPCEnvironment::fork_worker's: identified by
// a 9-field UPID, running asynchronously, with a log that ends in
// "TASK OK", "TASK WARNINGS: n" or "TASK ERROR: msg".
type task struct {
	upid      string
	node      string
	pid       uint32
	pstart    uint32
	starttime int64
	typ, id   string
	user      string

	mu    sync.Mutex
	lines []string
	// open is a line the worker printed without its newline (print
	// "calculating checksum..."): the next line written ends it, be it
	// fork_worker's "TASK ..." line
	open       string
	warnings   int
	running    bool
	exitstatus string
	endtime    int64
	done       chan struct{}
	// stop interrupts the worker (nil: stopping this kind of task is not
	// emulated).
	stop context.CancelFunc
}

// errInterrupted is the die of a worker's SIGTERM handler (pve-common
// RESTEnvironment.pm fork_worker: $SIG{TERM} = sub { die "received
// interrupt\n" }), the signal stop_task sends it.
var errInterrupted = errors.New("received interrupt")

func (t *task) logf(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimRight(fmt.Sprintf(format, a...), "\n"), "\n")
	lines[0] = t.open + lines[0]
	t.open = ""
	t.lines = append(t.lines, lines...)
}

// print is a worker's print without a newline: it opens a line the next
// logf (or the task's end) ends.
func (t *task) print(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.open += s
}

// endLocked writes fork_worker's last line ("TASK OK", "TASK WARNINGS: n",
// "TASK ERROR: msg"), ending an open line, and sets the exit status as
// pve-common UPID.pm read_status reads it from the log's last line: a
// line that does not begin with "TASK " so is "unexpected status".
func (t *task) endLocked(line string) {
	line = t.open + line
	t.open = ""
	t.lines = append(t.lines, line)
	switch {
	case line == "TASK OK":
		t.exitstatus = "OK"
	case strings.HasPrefix(line, "TASK ERROR: ") && len(line) > len("TASK ERROR: "):
		t.exitstatus = strings.TrimPrefix(line, "TASK ERROR: ")
	case reTaskWarnings.MatchString(line):
		t.exitstatus = strings.TrimPrefix(line, "TASK ")
	default:
		t.exitstatus = "unexpected status"
	}
}

// reTaskWarnings is read_status's m/^TASK (WARNINGS: \d+)$/.
var reTaskWarnings = regexp.MustCompile(`^TASK WARNINGS: [0-9]+$`)

func (t *task) warn(format string, a ...any) {
	t.mu.Lock()
	t.warnings++
	t.mu.Unlock()
	t.logf("WARN: "+format, a...)
}

var reUPID = regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$`)

// ParseUPID splits a UPID into its fields; ok is false when malformed.
func ParseUPID(upid string) (node string, pid, pstart uint64, starttime int64, typ, id, user string, ok bool) {
	m := reUPID.FindStringSubmatch(upid)
	if m == nil {
		return "", 0, 0, 0, "", "", "", false
	}
	pid, _ = strconv.ParseUint(m[3], 16, 32)
	pstart, _ = strconv.ParseUint(m[4], 16, 64)
	st, _ := strconv.ParseInt(m[5], 16, 64)
	return m[1], pid, pstart, st, m[6], m[7], m[8], true
}

// startTask runs fn as a task of the request's caller on the request's
// node (taskNode) and returns its UPID.
func (s *Server) startTask(rq *request, typ, id string, fn func(ctx context.Context, t *task) error) string {
	return s.runTask(rq, typ, id, fn, false)
}

// startStoppableTask is startTask for a worker that DELETE
// /nodes/{node}/tasks/{upid} may stop: fn's context ends at the stop, and
// fn then returns what the interrupted worker dies with (errInterrupted,
// or its caller's wrapping of it).
func (s *Server) startStoppableTask(rq *request, typ, id string, fn func(ctx context.Context, t *task) error) string {
	return s.runTask(rq, typ, id, fn, true)
}

func (s *Server) runTask(rq *request, typ, id string, fn func(ctx context.Context, t *task) error, stoppable bool) string {
	authid, node := rq.authid, rq.taskNode()
	if node == "" {
		node = s.node
	}
	s.mu.Lock()
	s.taskSeq++
	seq := s.taskSeq
	s.mu.Unlock()
	now := time.Now()
	t := &task{
		node: node, pid: 0x10000 + seq,
		pstart: uint32(now.UnixNano()/1e7) & 0x7fffffff, starttime: now.Unix(),
		typ: typ, id: id, user: authid, running: true, done: make(chan struct{}),
	}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", t.node, t.pid, t.pstart, t.starttime, t.typ, t.id, t.user)
	ctx := s.ctx
	if stoppable {
		ctx, t.stop = context.WithCancel(s.ctx)
	}
	s.mu.Lock()
	s.tasks[t.upid] = t
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(t.done)
		err := fn(ctx, t)
		if t.stop != nil {
			t.stop()
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		t.running = false
		t.endtime = time.Now().Unix()
		switch {
		case err != nil:
			t.endLocked("TASK ERROR: " + taskErrorMessage(err))
		case t.warnings > 0:
			t.endLocked(fmt.Sprintf("TASK WARNINGS: %d", t.warnings))
		default:
			t.endLocked("TASK OK")
		}
		s.log.Debug("task finished", "upid", t.upid, "exitstatus", t.exitstatus)
	}()
	return t.upid
}

// taskErrorMessage is what fork_worker makes of a worker's die (pve-common
// RESTEnvironment.pm fork_worker: chomp, every newline a space): a
// PVE::Exception stringified with its code and, for a parameter exception,
// one "param: message" line per error, so a failed hot-plug's task says
// which drive and why.
func taskErrorMessage(err error) string {
	msg := err.Error()
	if ae, ok := err.(*apiError); ok && (ae.code == http.StatusBadRequest || ae.code == http.StatusForbidden) {
		msg = strconv.Itoa(ae.code) + " " + ae.msg
		for _, k := range sortedKeys(ae.errors) {
			msg += k + ": " + strings.TrimSuffix(ae.errors[k], "\n") + "\n"
		}
	}
	return strings.ReplaceAll(strings.TrimSuffix(msg, "\n"), "\n", " ")
}

// WaitTask blocks until the task ends and returns its exitstatus.
func (s *Server) WaitTask(ctx context.Context, upid string) (string, error) {
	s.mu.Lock()
	t := s.tasks[upid]
	s.mu.Unlock()
	if t == nil {
		return "", fmt.Errorf("pveemu: no task %s", upid)
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exitstatus, nil
}

// lookupTask finds the request's task for its owner, or for a caller
// with priv on its node, in the order of pve-manager API2/Tasks.pm
// read_task_status and stop_task: the UPID is decoded ("unable to parse
// worker upid"), its log file must exist ("no such task", both parameter
// exceptions), and only then is the caller checked.
func (s *Server) lookupTask(rq *request, priv string) (*task, error) {
	upid := rq.str("upid")
	if _, _, _, _, _, _, _, ok := ParseUPID(upid); !ok {
		return nil, paramFail(ParamErrors{"upid": "unable to parse worker upid"})
	}
	t := s.nodeTask(rq)
	if t == nil {
		return nil, paramFail(ParamErrors{"upid": "no such task"})
	}
	if !taskOwner(t.user, rq.authid) {
		if err := s.checkPrivs(rq.authid, "/nodes/"+t.node, []string{priv}, false); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// nodeTask is the request's task when the request's node has it: another
// node's task is not in this node's task log directory.
func (s *Server) nodeTask(rq *request) *task {
	s.mu.Lock()
	t := s.tasks[rq.str("upid")]
	s.mu.Unlock()
	if t == nil || t.node != rq.str("node") {
		return nil
	}
	return t
}

// taskOwner is pve-manager API2/Tasks.pm $check_task_user after
// $convert_token_task: a token's task (its UPID's user is the token id
// user@realm!name) is its token's and its user's; a user's task is that
// user's alone, not its tokens'.
func taskOwner(taskUser, authid string) bool {
	if user, _, ok := strings.Cut(taskUser, "!"); ok {
		return authid == taskUser || authid == user
	}
	return authid == taskUser
}

// stopTask is DELETE /nodes/{node}/tasks/{upid} (pve-manager
// API2/Tasks.pm stop_task): the task's owner, or a caller with Sys.Modify
// on the node; then PVE::RESTEnvironment check_worker with kill: nothing
// for a task that has ended, else SIGTERM to the worker's process group
// and, 5 seconds later, SIGKILL ($kill_process_group), the call returning
// once the worker is gone. The emulator's workers that can be stopped
// (download-url's, a CT snapshot's) end with what Proxmox's die with; any other running
// task is refused as not emulated.
func (s *Server) stopTask(_ context.Context, rq *request) (any, error) {
	t, err := s.lookupTask(rq, "Sys.Modify")
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	running := t.running
	t.mu.Unlock()
	if !running {
		return nil, nil
	}
	if t.stop == nil {
		return nil, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("emulator: stopping a running %s task is not emulated\n", t.typ)}
	}
	t.stop()
	select {
	case <-t.done:
	case <-time.After(5 * time.Second):
	}
	return nil, nil
}

func (s *Server) taskStatus(_ context.Context, rq *request) (any, error) {
	t, err := s.lookupTask(rq, "Sys.Audit")
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]any{
		"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart, "starttime": t.starttime,
		"type": t.typ, "id": t.id, "user": t.user, "status": "running",
	}
	// A token's task reports user and token apart (Tasks.pm
	// $convert_token_task).
	if user, tok, ok := strings.Cut(t.user, "!"); ok {
		out["user"], out["tokenid"] = user, tok
	}
	if !t.running {
		out["status"] = "stopped"
		out["exitstatus"] = t.exitstatus
	}
	return out, nil
}

// taskLog is GET /nodes/{node}/tasks/{upid}/log (pve-manager
// API2/Tasks.pm read_task_log). Unlike the status it checks the caller
// before it looks for the task: the UPID decoded, its owner (the UPID's
// user, whether or not the task exists) or a caller with Sys.Audit on the
// node passes, and then the log file is read by pve-common Tools.pm
// dump_logfile, which answers a file it cannot open with the one line
// "unable to open file - <errno>" and an empty one with "no content".
func (s *Server) taskLog(_ context.Context, rq *request) (any, error) {
	_, _, _, _, _, _, user, ok := ParseUPID(rq.str("upid"))
	if !ok {
		return nil, paramFail(ParamErrors{"upid": "unable to parse worker upid"})
	}
	if !taskOwner(user, rq.authid) {
		if err := s.checkPrivs(rq.authid, "/nodes/"+rq.str("node"), []string{"Sys.Audit"}, false); err != nil {
			return nil, err
		}
	}
	t := s.nodeTask(rq)
	if t == nil {
		return []map[string]any{{"n": 1, "t": "unable to open file - No such file or directory"}}, nil
	}
	start := rq.int("start", 0)
	limit := rq.int("limit", 50)
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []map[string]any{}
	for i := start; i < len(t.lines) && (limit <= 0 || len(out) < limit); i++ {
		out = append(out, map[string]any{"n": i + 1, "t": t.lines[i]})
	}
	if len(t.lines) == 0 {
		out = append(out, map[string]any{"n": 1, "t": "no content"})
	}
	return out, nil
}

// clusterTasks is GET /cluster/tasks (pve-manager PVE/API2/Cluster.pm
// tasks): the node's recent tasks, running ones without endtime; a token's
// tasks with user and tokenid apart; all of them with Sys.Audit on "/",
// else the caller's own.
func (s *Server) clusterTasks(_ context.Context, rq *request) (any, error) {
	all := s.privileges(rq.authid, "/")["Sys.Audit"]
	s.mu.Lock()
	ts := make([]*task, 0, len(s.tasks))
	for _, t := range s.tasks {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].upid > ts[j].upid })
	out := []map[string]any{}
	for _, t := range ts {
		t.mu.Lock()
		e := map[string]any{"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart, "starttime": t.starttime,
			"type": t.typ, "id": t.id, "user": t.user}
		if !t.running {
			e["endtime"] = t.endtime
			e["status"] = t.exitstatus
		}
		t.mu.Unlock()
		if user, tok, ok := strings.Cut(t.user, "!"); ok {
			e["user"], e["tokenid"] = user, tok
		}
		if all || t.user == rq.authid {
			out = append(out, e)
		}
	}
	return out, nil
}
