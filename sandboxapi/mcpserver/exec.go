package mcpserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// ExecInput are the arguments of sandbox_exec.
type ExecInput struct {
	ID             string            `json:"id" jsonschema:"sandbox id"`
	VM             string            `json:"vm,omitempty" jsonschema:"VM name in the sandbox; default: its first VM with a guest agent"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"program and arguments, run without a shell; give argv or command"`
	Command        string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c; give argv or command"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text sent to the command's standard input"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	User           string            `json:"user,omitempty" jsonschema:"user to run as (default root)"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"kill the process tree after this many seconds (default: the server's)"`
}

// ExecOutput is the result of sandbox_exec.
type ExecOutput struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// Encoding is "text", or "base64" when the output is not UTF-8.
	Encoding        string `json:"encoding"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	// Note says in words what was truncated or killed.
	Note string `json:"note,omitempty"`
}

func (t *tools) exec(ctx context.Context, req *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	var zero ExecOutput
	argv := in.Argv
	switch {
	case len(argv) > 0 && in.Command != "":
		return nil, zero, invalid("argv", "give argv or command, not both")
	case in.Command != "":
		argv = []string{"sh", "-c", in.Command}
	case len(argv) == 0:
		return nil, zero, invalid("argv", "argv or command is required")
	}
	if in.TimeoutSeconds < 0 {
		return nil, zero, invalid("timeout_seconds", "timeout_seconds must be positive")
	}
	vm, err := t.guestVM(ctx, in.ID, in.VM)
	if err != nil {
		return nil, zero, err
	}
	er := apitype.ExecRequest{Argv: argv, Cwd: in.Cwd, Env: in.Env, User: in.User, TimeoutSeconds: in.TimeoutSeconds, OutputLimit: t.o.OutputLimit}
	if in.Stdin != "" {
		er.Stdin = []byte(in.Stdin)
	}
	var res *apitype.ExecResult
	if tok := progressToken(req); tok != nil {
		res, err = t.execProgress(ctx, req.Session, tok, in.ID, vm, er)
	} else {
		res, err = t.api.Exec(ctx, in.ID, vm, er)
	}
	if err != nil {
		return nil, zero, toolErr(err)
	}
	return nil, t.execOutput(res), nil
}

func progressToken(req *mcp.CallToolRequest) any {
	if req == nil || req.Params == nil || req.Session == nil {
		return nil
	}
	return req.Params.GetProgressToken()
}

// execOutput shapes an API result for the agent.
func (t *tools) execOutput(res *apitype.ExecResult) ExecOutput {
	out := ExecOutput{ExitCode: res.ExitCode, StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated, TimedOut: res.TimedOut}
	enc := "text"
	if !validUTF8(res.Stdout) || !validUTF8(res.Stderr) {
		enc = "base64"
	}
	out.Stdout, out.Encoding = encode(res.Stdout, enc)
	out.Stderr, _ = encode(res.Stderr, enc)
	var notes []string
	if res.StdoutTruncated {
		notes = append(notes, fmt.Sprintf("stdout truncated at %d bytes", t.o.OutputLimit))
	}
	if res.StderrTruncated {
		notes = append(notes, fmt.Sprintf("stderr truncated at %d bytes", t.o.OutputLimit))
	}
	if res.TimedOut {
		notes = append(notes, "timed out: the process tree was killed")
	}
	out.Note = strings.Join(notes, "; ")
	return out
}

// execProgress runs the command with its output streamed from the API and
// sends progress notifications: on output (the first chunk at once, then
// at most every progressEvery) and every heartbeatEvery while the command
// is silent. Progress is the milliseconds since the start; the message
// says how much output came and its last line.
func (t *tools) execProgress(ctx context.Context, ss *mcp.ServerSession, tok any, id, vm string, er apitype.ExecRequest) (*apitype.ExecResult, error) {
	p := &progress{ctx: ctx, ss: ss, tok: tok, start: time.Now()}
	stdout := &capped{limit: t.o.OutputLimit, p: p}
	stderr := &capped{limit: t.o.OutputLimit, p: p}
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.heartbeat(hctx) }()
	res, err := t.api.ExecStream(ctx, id, vm, er, stdout, stderr)
	stop()
	<-done
	if err != nil {
		return nil, err
	}
	res.Stdout, res.Stderr = stdout.buf.Bytes(), stderr.buf.Bytes()
	res.StdoutTruncated = res.StdoutTruncated || stdout.over
	res.StderrTruncated = res.StderrTruncated || stderr.over
	return res, nil
}

// progressEvery spaces progress notifications on output; heartbeatEvery
// is the longest gap while the command is silent.
const (
	progressEvery  = 500 * time.Millisecond
	heartbeatEvery = 5 * time.Second
)

// progress sends notifications for one call; both streams and the
// heartbeat share it.
type progress struct {
	ctx   context.Context
	ss    *mcp.ServerSession
	tok   any
	start time.Time

	mu    sync.Mutex // guards the fields below and orders notifications
	total int64
	last  time.Time
	line  string
	sent  float64
}

// add notes output and notifies unless one went out just now.
func (p *progress) add(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total += int64(len(b))
	if i := bytes.LastIndexByte(bytes.TrimRight(b, "\n"), '\n'); i >= 0 {
		b = b[i+1:]
	}
	if l := strings.TrimSpace(string(b)); l != "" && len(l) <= 200 && validUTF8([]byte(l)) {
		p.line = l
	}
	if !p.last.IsZero() && time.Since(p.last) < progressEvery {
		return
	}
	p.notifyLocked()
}

// heartbeat notifies every heartbeatEvery without output until ctx ends.
func (p *progress) heartbeat(ctx context.Context) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.mu.Lock()
			if time.Since(p.last) >= heartbeatEvery {
				p.notifyLocked()
			}
			p.mu.Unlock()
		}
	}
}

func (p *progress) notifyLocked() {
	p.last = time.Now()
	// Progress must grow with every notification.
	v := max(float64(p.last.Sub(p.start).Milliseconds()), p.sent+1)
	p.sent = v
	msg := fmt.Sprintf("running %s, %d bytes of output", p.last.Sub(p.start).Round(time.Second), p.total)
	if p.line != "" {
		msg += "; last: " + p.line
	}
	// A lost notification is no reason to stop the command.
	_ = p.ss.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{ProgressToken: p.tok, Progress: v, Message: msg})
}

// capped keeps the first limit bytes written and notes the rest.
type capped struct {
	limit int64
	buf   bytes.Buffer
	over  bool
	p     *progress
}

func (c *capped) Write(b []byte) (int, error) {
	c.p.add(b)
	if room := c.limit - int64(c.buf.Len()); room < int64(len(b)) {
		c.over = true
		c.buf.Write(b[:max(room, 0)])
		return len(b), nil
	}
	c.buf.Write(b)
	return len(b), nil
}

// ReadFileInput are the arguments of sandbox_read_file.
type ReadFileInput struct {
	ID       string `json:"id" jsonschema:"sandbox id"`
	VM       string `json:"vm,omitempty" jsonschema:"VM name in the sandbox; default: its first VM with a guest agent"`
	Path     string `json:"path" jsonschema:"absolute path in the VM"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default; base64 anyway when the file is not UTF-8) or base64"`
	MaxBytes int64  `json:"max_bytes,omitempty" jsonschema:"refuse files larger than this (default and upper bound: the server's cap)"`
}

// FileContent is the result of sandbox_read_file.
type FileContent struct {
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	Encoding string `json:"encoding"`
	Content  string `json:"content"`
}

// WriteFileInput are the arguments of sandbox_write_file.
type WriteFileInput struct {
	ID       string `json:"id" jsonschema:"sandbox id"`
	VM       string `json:"vm,omitempty" jsonschema:"VM name in the sandbox; default: its first VM with a guest agent"`
	Path     string `json:"path" jsonschema:"absolute path in the VM"`
	Content  string `json:"content" jsonschema:"the file's content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permission bits such as 0644"`
}

// FileWritten is the result of sandbox_write_file.
type FileWritten struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// errOverCap stops a read past the cap.
var errOverCap = errors.New("over the cap")

// limitWriter fails once more than n bytes were written.
type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if int64(len(b)) > l.n {
		return 0, errOverCap
	}
	l.n -= int64(len(b))
	return l.w.Write(b)
}

func absPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return invalid("path", "path must be absolute, got %q", p)
	}
	return nil
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, FileContent, error) {
	var zero FileContent
	if err := absPath(in.Path); err != nil {
		return nil, zero, err
	}
	if in.Encoding != "" && in.Encoding != "text" && in.Encoding != "base64" {
		return nil, zero, invalid("encoding", "encoding must be text or base64, got %q", in.Encoding)
	}
	limit := t.o.MaxReadBytes
	if in.MaxBytes < 0 {
		return nil, zero, invalid("max_bytes", "max_bytes must be positive")
	}
	if in.MaxBytes > 0 && in.MaxBytes < limit {
		limit = in.MaxBytes
	}
	vm, err := t.guestVM(ctx, in.ID, in.VM)
	if err != nil {
		return nil, zero, err
	}
	var buf bytes.Buffer
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, err := t.api.ReadFile(rctx, in.ID, vm, in.Path, &limitWriter{w: &buf, n: limit})
	if errors.Is(err, errOverCap) {
		return nil, zero, &ToolError{&apitype.Problem{Type: apitype.ProblemOutputLimit, Title: "Output over the limit", Status: 413,
			Detail: fmt.Sprintf("%s is larger than %d bytes; read a part with sandbox_exec (head -c, tail -c, split)", in.Path, limit)}}
	}
	if err != nil {
		return nil, zero, toolErr(err)
	}
	content, enc := encode(buf.Bytes(), in.Encoding)
	return nil, FileContent{Path: in.Path, Size: n, Encoding: enc, Content: content}, nil
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, FileWritten, error) {
	var zero FileWritten
	if err := absPath(in.Path); err != nil {
		return nil, zero, err
	}
	b, err := decode(in.Content, in.Encoding)
	if err != nil {
		return nil, zero, err
	}
	if int64(len(b)) > t.o.MaxWriteBytes {
		return nil, zero, &ToolError{&apitype.Problem{Type: apitype.ProblemPayloadTooLarge, Title: "Request body too large", Status: 413,
			Detail: fmt.Sprintf("content is %d bytes, over the cap of %d; split it into parts and join them with sandbox_exec", len(b), t.o.MaxWriteBytes), Field: "content"}}
	}
	mode, err := parseMode(in.Mode)
	if err != nil {
		return nil, zero, err
	}
	vm, err := t.guestVM(ctx, in.ID, in.VM)
	if err != nil {
		return nil, zero, err
	}
	if err := t.api.WriteFile(ctx, in.ID, vm, in.Path, bytes.NewReader(b), int64(len(b)), mode); err != nil {
		return nil, zero, toolErr(err)
	}
	return nil, FileWritten{Path: in.Path, Size: int64(len(b))}, nil
}

func validUTF8(b []byte) bool { return utf8.Valid(b) }
