package mcpserver_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

func TestToolsFollowScopes(t *testing.T) {
	read := []string{mcpserver.ToolEgressLog, mcpserver.ToolGet, mcpserver.ToolList}
	exec := append(slices.Clone(read), mcpserver.ToolCheck, mcpserver.ToolExec, mcpserver.ToolReadFile, mcpserver.ToolRollback, mcpserver.ToolSnapshot, mcpserver.ToolWriteFile)
	admin := append(slices.Clone(exec), mcpserver.ToolCreate, mcpserver.ToolDestroy, mcpserver.ToolExtend)
	for _, tc := range []struct {
		scope string
		want  []string
	}{
		{apitype.ScopeRead, read},
		{apitype.ScopeExec, exec},
		{apitype.ScopeAdmin, admin},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			b := newBed(t, bedOpts{scopes: []string{tc.scope}})
			l, err := b.sess.ListTools(b.ctx(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tl := range l.Tools {
				got = append(got, tl.Name)
				if tl.Description == "" || tl.InputSchema == nil || tl.OutputSchema == nil {
					t.Errorf("%s: description, input or output schema missing", tl.Name)
				}
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("tools %v, want %v", got, want)
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	b := newBed(t, bedOpts{})
	sb := b.create()
	if sb.State != apitype.StateReady || len(sb.VMs) != 1 || sb.VMs[0].Cores != 2 || sb.VMs[0].MemoryMiB != 4096 || sb.Labels["agent"] != "t" {
		t.Fatalf("created: %+v", sb)
	}
	if life := sb.ExpiresAt.Sub(sb.CreatedAt); life != 4*time.Hour {
		t.Errorf("default lifetime %s, want 4h", life)
	}
	id, vm := sb.ID, sb.VMs[0].Name

	l := ok[mcpserver.SandboxList](t, "list", b.call(mcpserver.ToolList, nil))
	if len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != id {
		t.Errorf("list: %+v", l)
	}
	if g := ok[apitype.Sandbox](t, "get", b.call(mcpserver.ToolGet, map[string]any{"id": id})); g.ID != id {
		t.Errorf("get: %+v", g)
	}

	// exec: argv, shell line (the fake knows no sh: 127), stdin, exit codes
	for _, tc := range []struct {
		name     string
		args     map[string]any
		exit     int
		stdout   string
		stderrIn string
	}{
		{"argv", map[string]any{"id": id, "argv": []string{"uname", "-a"}}, 0, "Linux fake-", ""},
		{"explicit vm", map[string]any{"id": id, "vm": vm, "argv": []string{"echo", "hi", "there"}}, 0, "hi there\n", ""},
		{"exit code", map[string]any{"id": id, "argv": []string{"fail", "3"}}, 3, "", "failing"},
		{"stdin", map[string]any{"id": id, "argv": []string{"cat"}, "stdin": "from stdin"}, 0, "from stdin", ""},
		{"shell line", map[string]any{"id": id, "command": "echo hi | tr a-z A-Z"}, 127, "", "sh: command not found"},
	} {
		t.Run("exec "+tc.name, func(t *testing.T) {
			o := ok[mcpserver.ExecOutput](t, tc.name, b.call(mcpserver.ToolExec, tc.args))
			if o.ExitCode != tc.exit || !strings.HasPrefix(o.Stdout, tc.stdout) || !strings.Contains(o.Stderr, tc.stderrIn) || o.Encoding != "text" || o.TimedOut {
				t.Errorf("exec: %+v", o)
			}
		})
	}

	// files: text and base64, round trip of binary data
	blob := make([]byte, 1<<20)
	_, _ = rand.Read(blob)
	w := ok[mcpserver.FileWritten](t, "write", b.call(mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/root/blob", "content": base64.StdEncoding.EncodeToString(blob), "encoding": "base64", "mode": "0600"}))
	if w.Size != 1<<20 {
		t.Errorf("written %+v", w)
	}
	if m := b.api.modes["/root/blob"]; m != 0o600 {
		t.Errorf("mode %o, want 600", m)
	}
	r := ok[mcpserver.FileContent](t, "read", b.call(mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/root/blob"}))
	back, err := base64.StdEncoding.DecodeString(r.Content)
	if err != nil || r.Encoding != "base64" || r.Size != 1<<20 || !bytes.Equal(back, blob) {
		t.Errorf("read back: encoding %s size %d err %v equal %v", r.Encoding, r.Size, err, bytes.Equal(back, blob))
	}
	ok[mcpserver.FileWritten](t, "write text", b.call(mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/etc/motd", "content": "héllo\n"}))
	if r := ok[mcpserver.FileContent](t, "read text", b.call(mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/etc/motd"})); r.Content != "héllo\n" || r.Encoding != "text" {
		t.Errorf("read text: %+v", r)
	}
	if r := ok[mcpserver.FileContent](t, "read as base64", b.call(mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/etc/motd", "encoding": "base64"})); r.Content != base64.StdEncoding.EncodeToString([]byte("héllo\n")) {
		t.Errorf("read base64: %+v", r)
	}

	// snapshot, change, rollback: the change is gone
	s := ok[mcpserver.SnapshotResult](t, "snapshot", b.call(mcpserver.ToolSnapshot, map[string]any{"id": id, "name": "clean"}))
	if s.VM != vm || s.Name != "clean" {
		t.Errorf("snapshot: %+v", s)
	}
	ok[mcpserver.FileWritten](t, "write", b.call(mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/etc/motd", "content": "changed"}))
	ok[mcpserver.SnapshotResult](t, "rollback", b.call(mcpserver.ToolRollback, map[string]any{"id": id, "vm": vm, "name": "clean"}))
	if r := ok[mcpserver.FileContent](t, "read", b.call(mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/etc/motd"})); r.Content != "héllo\n" {
		t.Errorf("after rollback: %q", r.Content)
	}

	rep := ok[apitype.CheckReport](t, "check", b.call(mcpserver.ToolCheck, map[string]any{"id": id}))
	if !rep.Pass || rep.Sandbox != id || len(rep.Rows) != 1 || rep.Rows[0].Observed != "ok" {
		t.Errorf("check: %+v", rep)
	}

	e := ok[apitype.Sandbox](t, "extend", b.call(mcpserver.ToolExtend, map[string]any{"id": id, "lifetime_hours": 24}))
	if d := time.Until(e.ExpiresAt); d < 23*time.Hour || d > 24*time.Hour {
		t.Errorf("extended to %s from now, want 24h", d)
	}

	d := ok[mcpserver.Destroyed](t, "destroy", b.call(mcpserver.ToolDestroy, map[string]any{"id": id}))
	if !d.Destroyed || d.ID != id {
		t.Errorf("destroy: %+v", d)
	}
	if l := ok[mcpserver.SandboxList](t, "list", b.call(mcpserver.ToolList, nil)); len(l.Sandboxes) != 0 {
		t.Errorf("after destroy: %+v", l)
	}
}

func TestPresetsAndLifetimes(t *testing.T) {
	b := newBed(t, bedOpts{api: func(o *sandbox.Options) { o.Caps = sandbox.Caps{} }, mcp: func(o *mcpserver.Options) {
		o.Presets = map[string]mcpserver.Preset{"tiny": {Cores: 1, MemoryMiB: 512}, "big": {Cores: 8, MemoryMiB: 16384, DiskGiB: 40}}
		o.DefaultPreset = "tiny"
		o.DefaultLifetime = 2 * time.Hour
		o.MaxLifetime = 12 * time.Hour
	}})
	for _, tc := range []struct {
		args  map[string]any
		cores int
		mem   int
		disk  int
		life  time.Duration
	}{
		{map[string]any{}, 1, 512, 0, 2 * time.Hour},
		{map[string]any{"size": "big", "lifetime_hours": 12}, 8, 16384, 40, 12 * time.Hour},
		{map[string]any{"size": "tiny", "lifetime_hours": 1, "template": "debian"}, 1, 512, 0, time.Hour},
	} {
		sb := ok[apitype.Sandbox](t, "create", b.call(mcpserver.ToolCreate, tc.args))
		v := sb.VMs[0]
		if v.Cores != tc.cores || v.MemoryMiB != tc.mem || v.DiskGiB != tc.disk || sb.ExpiresAt.Sub(sb.CreatedAt) != tc.life {
			t.Errorf("%v: vm %+v lifetime %s", tc.args, v, sb.ExpiresAt.Sub(sb.CreatedAt))
		}
	}
	if p := problem(t, "create", b.call(mcpserver.ToolCreate, map[string]any{"lifetime_hours": 13})); p.Type != apitype.ProblemInvalidRequest || p.Field != "lifetime_hours" {
		t.Errorf("lifetime over the max: %+v", p)
	}
}

func TestErrors(t *testing.T) {
	b := newBed(t, bedOpts{mcp: func(o *mcpserver.Options) {
		o.MaxReadBytes = 1000
		o.MaxWriteBytes = 2000
		o.OutputLimit = 8
	}})
	sb := b.create()
	id := sb.ID
	ok[mcpserver.FileWritten](t, "write", b.call(mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/root/big", "content": strings.Repeat("x", 1001)}))
	for _, tc := range []struct {
		name  string
		tool  string
		args  map[string]any
		typ   string // problem type; "sdk" for the SDK's schema validation
		field string
		in    string // in the detail
	}{
		{"unknown sandbox get", mcpserver.ToolGet, map[string]any{"id": "sb-nope"}, apitype.ProblemNotFound, "", "sb-nope"},
		{"unknown sandbox exec", mcpserver.ToolExec, map[string]any{"id": "sb-nope", "argv": []string{"true"}}, apitype.ProblemNotFound, "", ""},
		{"unknown sandbox destroy vm", mcpserver.ToolExec, map[string]any{"id": id, "vm": "nope", "argv": []string{"true"}}, apitype.ProblemNotFound, "", ""},
		{"cap refused", mcpserver.ToolCreate, map[string]any{"size": "medium"}, apitype.ProblemGuardRefused, "", "node_vcpus"},
		{"guest agent timeout", mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"hang"}}, apitype.ProblemGuestTimeout, "", ""},
		{"file over the cap", mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/root/big"}, apitype.ProblemOutputLimit, "", "larger than 1000"},
		{"file over max_bytes", mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/root/big", "max_bytes": 10}, apitype.ProblemOutputLimit, "", "larger than 10"},
		{"file not found", mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/nope"}, apitype.ProblemFileNotFound, "", ""},
		{"is a directory", mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/etc/"}, apitype.ProblemIsDirectory, "", ""},
		{"permission", mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/proc/x", "content": "1"}, apitype.ProblemPermissionDenied, "", ""},
		{"write over the cap", mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/root/x", "content": strings.Repeat("y", 2001)}, apitype.ProblemPayloadTooLarge, "content", ""},
		{"no id", mcpserver.ToolGet, map[string]any{"id": " "}, apitype.ProblemInvalidRequest, "id", ""},
		{"missing id", mcpserver.ToolGet, map[string]any{}, "sdk", "", "id"},
		{"unknown argument", mcpserver.ToolList, map[string]any{"bogus": 1}, "sdk", "", "bogus"},
		{"wrong type", mcpserver.ToolExec, map[string]any{"id": id, "argv": "uname -a"}, "sdk", "", "argv"},
		{"argv and command", mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"a"}, "command": "b"}, apitype.ProblemInvalidRequest, "argv", ""},
		{"no command", mcpserver.ToolExec, map[string]any{"id": id}, apitype.ProblemInvalidRequest, "argv", ""},
		{"negative timeout", mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"a"}, "timeout_seconds": -1}, apitype.ProblemInvalidRequest, "timeout_seconds", ""},
		{"relative path", mcpserver.ToolReadFile, map[string]any{"id": id, "path": "etc/passwd"}, apitype.ProblemInvalidRequest, "path", ""},
		{"bad read encoding", mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/etc/motd", "encoding": "hex"}, apitype.ProblemInvalidRequest, "encoding", ""},
		{"bad base64", mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/x", "content": "!!", "encoding": "base64"}, apitype.ProblemInvalidRequest, "content", ""},
		{"bad mode", mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/x", "content": "a", "mode": "rw-"}, apitype.ProblemInvalidRequest, "mode", ""},
		{"unknown size", mcpserver.ToolCreate, map[string]any{"size": "huge"}, apitype.ProblemInvalidRequest, "size", "huge"},
		{"lifetime 0.5", mcpserver.ToolCreate, map[string]any{"lifetime_hours": 0.5}, "sdk", "", ""},
		{"lifetime 25", mcpserver.ToolCreate, map[string]any{"lifetime_hours": 25}, apitype.ProblemInvalidRequest, "lifetime_hours", "1..24"},
		{"lifetime -1", mcpserver.ToolExtend, map[string]any{"id": id, "lifetime_hours": -1}, apitype.ProblemInvalidRequest, "lifetime_hours", ""},
		{"extend without lifetime", mcpserver.ToolExtend, map[string]any{"id": id, "lifetime_hours": 0}, apitype.ProblemInvalidRequest, "lifetime_hours", ""},
		{"unknown template", mcpserver.ToolCreate, map[string]any{"template": "nope"}, apitype.ProblemInvalidRequest, "template", "nope"},
		{"snapshot without name", mcpserver.ToolSnapshot, map[string]any{"id": id, "name": ""}, apitype.ProblemInvalidRequest, "name", ""},
		{"rollback unknown sandbox", mcpserver.ToolRollback, map[string]any{"id": "sb-nope", "name": "x"}, apitype.ProblemNotFound, "", ""},
		{"check unknown vm", mcpserver.ToolCheck, map[string]any{"id": id, "vm": "nope"}, apitype.ProblemNotFound, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(ok[mcpserver.SandboxList](t, "list", b.call(mcpserver.ToolList, nil)).Sandboxes)
			p := problem(t, tc.tool, b.call(tc.tool, tc.args))
			if p.Type != tc.typ || p.Field != tc.field || !strings.Contains(p.Detail, tc.in) {
				t.Errorf("problem %+v, want type %s field %q detail with %q", p, tc.typ, tc.field, tc.in)
			}
			if tc.typ == apitype.ProblemGuardRefused && p.Cap == "" {
				t.Errorf("guard refusal without the cap: %+v", p)
			}
			if after := len(ok[mcpserver.SandboxList](t, "list", b.call(mcpserver.ToolList, nil)).Sandboxes); after != before {
				t.Errorf("sandboxes %d -> %d: bad input changed something", before, after)
			}
		})
	}
}

func TestExecLimits(t *testing.T) {
	b := newBed(t, bedOpts{mcp: func(o *mcpserver.Options) { o.OutputLimit = 8 }})
	id := b.create().ID
	o := ok[mcpserver.ExecOutput](t, "exec", b.call(mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"echo", "more than eight bytes"}}))
	if o.Stdout != "more tha" || !o.StdoutTruncated || !strings.Contains(o.Note, "stdout truncated at 8 bytes") {
		t.Errorf("capped output: %+v", o)
	}
	o = ok[mcpserver.ExecOutput](t, "exec", b.call(mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"sleep"}, "timeout_seconds": 1}))
	if !o.TimedOut || !strings.Contains(o.Note, "timed out") {
		t.Errorf("timeout: %+v", o)
	}
	// Non-UTF-8 output comes as base64.
	ok[mcpserver.FileWritten](t, "write", b.call(mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/bin.dat", "content": base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe}), "encoding": "base64"}))
	o = ok[mcpserver.ExecOutput](t, "exec", b.call(mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"cat", "/bin.dat"}}))
	if o.Encoding != "base64" || o.Stdout != "//4=" {
		t.Errorf("binary output: %+v", o)
	}
}

func TestProgressAndCancel(t *testing.T) {
	b := newBed(t, bedOpts{mcp: func(o *mcpserver.Options) { o.OutputLimit = 12 }})
	id := b.create().ID
	params := &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": id, "argv": []string{"stream", "6"}}}
	params.SetProgressToken("tok-1")
	res, err := b.sess.CallTool(b.ctx(), params)
	if err != nil {
		t.Fatal(err)
	}
	o := ok[mcpserver.ExecOutput](t, "exec", res)
	if o.Stdout != "out 0\nout 2\n" || !o.StdoutTruncated || o.Stderr != "err 1\nerr 3\n" || !o.StderrTruncated {
		t.Errorf("streamed exec: %+v", o)
	}
	select {
	case p := <-b.progress:
		if p.ProgressToken != "tok-1" || p.Progress <= 0 || !strings.Contains(p.Message, "bytes of output") {
			t.Errorf("progress %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no progress notification")
	}

	// A silent command still reports that it runs (the heartbeat).
	params = &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": id, "argv": []string{"sleep"}, "timeout_seconds": 6}}
	params.SetProgressToken("tok-quiet")
	res, err = b.sess.CallTool(b.ctx(), params)
	if err != nil {
		t.Fatal(err)
	}
	if o := ok[mcpserver.ExecOutput](t, "exec", res); !o.TimedOut {
		t.Errorf("sleep: %+v", o)
	}
	quiet := 0
	for len(b.progress) > 0 {
		if p := <-b.progress; p.ProgressToken == "tok-quiet" && strings.Contains(p.Message, "0 bytes of output") {
			quiet++
		}
	}
	if quiet == 0 {
		t.Error("no heartbeat while the command was silent")
	}

	// Cancelling the call cancels the API request that runs the command.
	ctx, cancel := context.WithCancel(b.ctx())
	params = &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": id, "argv": []string{"sleep"}, "timeout_seconds": 300}}
	params.SetProgressToken("tok-2")
	done := make(chan error, 1)
	n0, _ := b.api.execs()
	s0 := b.api.startedExecs()
	go func() { _, err := b.sess.CallTool(ctx, params); done <- err }()
	// the command runs once the API was asked: cancel after that
	b.api.waitExecStarted(t, s0)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
	waitCancelled(t, b.api, n0)
}

// waitCancelled waits for the API exec after the first n0 to end, and
// checks that it ended by cancellation (over the in-process client the
// API may report it in the stream's error record).
func waitCancelled(t *testing.T, rec *recorder, n0 int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := rec.execs()
		if n > n0 {
			if !errors.Is(err, context.Canceled) && !strings.Contains(fmt.Sprint(err), "context canceled") {
				t.Errorf("API exec ended with %v, want context.Canceled", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the API exec was not cancelled")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSecretsWritten: [mcp] env goes with every create and lands in the VM
// (the API writes it, mode 0600; the bed's playground test checks the
// mode on a real guest); no tool shows it.
func TestSecretsWritten(t *testing.T) {
	const secret = "sk-ant-not-a-real-key-'quoted'"
	b := newBed(t, bedOpts{mcp: func(o *mcpserver.Options) {
		o.Env = map[string]string{"ANTHROPIC_API_KEY": secret, "OTHER": "x"}
	}})
	res := b.call(mcpserver.ToolCreate, nil)
	if strings.Contains(text(res), "sk-ant") {
		t.Fatal("create result carries the secret")
	}
	sb := ok[apitype.Sandbox](t, "create", res)
	o := ok[mcpserver.ExecOutput](t, "cat", b.call(mcpserver.ToolExec, map[string]any{"id": sb.ID, "argv": []string{"cat", apitype.GuestEnvPath}}))
	if want := string(apitype.EnvFile(map[string]string{"ANTHROPIC_API_KEY": secret, "OTHER": "x"})); o.Stdout != want {
		t.Errorf("env file %q, want %q", o.Stdout, want)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{{mcpserver.ToolList, nil}, {mcpserver.ToolGet, map[string]any{"id": sb.ID}}} {
		if strings.Contains(text(b.call(c.tool, c.args)), "sk-ant") {
			t.Errorf("%s shows the secret", c.tool)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    mcpserver.Options
		ok   bool
	}{
		{"defaults", mcpserver.Options{}, true},
		{"unknown default preset", mcpserver.Options{DefaultPreset: "xl"}, false},
		{"zero cores", mcpserver.Options{Presets: map[string]mcpserver.Preset{"small": {MemoryMiB: 512}}}, false},
		{"default over max", mcpserver.Options{DefaultLifetime: 30 * time.Hour}, false},
		{"under an hour", mcpserver.Options{DefaultLifetime: time.Minute}, false},
		{"bad env name", mcpserver.Options{Env: map[string]string{"1X": "v"}}, false},
		{"NUL in a value", mcpserver.Options{Env: map[string]string{"K": "a\x00b"}}, false},
		{"env ok", mcpserver.Options{Env: map[string]string{"OPENAI_API_KEY": "v"}}, true},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v", tc.name, err)
		}
	}
}

// TestCreateClaimsFromPool: sandbox_create gets the warm pool without any
// change: its default size matches a shape of the same size, the create
// claims the member, and the secrets file is written at the claim.
func TestCreateClaimsFromPool(t *testing.T) {
	b := newBed(t, bedOpts{
		api: func(o *sandbox.Options) {
			o.WarmPool = []sandbox.PoolShape{{Name: "agent", Template: "debian", Cores: 2, MemoryMiB: 4096, Target: 1}}
		},
		mcp: func(o *mcpserver.Options) { o.Env = map[string]string{"KEY": "v"} },
	})
	b.srv.Engine().MaintainPool(context.Background())
	members := b.srv.Engine().Pool().Members
	if len(members) != 1 {
		t.Fatalf("members %+v", members)
	}
	sb := ok[apitype.Sandbox](t, "create", b.call(mcpserver.ToolCreate, nil))
	if !sb.FromPool || sb.ID != members[0].ID {
		t.Fatalf("create: %+v, want the member %s claimed", sb, members[0].ID)
	}
	o := ok[mcpserver.ExecOutput](t, "cat", b.call(mcpserver.ToolExec, map[string]any{"id": sb.ID, "argv": []string{"cat", apitype.GuestEnvPath}}))
	if want := string(apitype.EnvFile(map[string]string{"KEY": "v"})); o.Stdout != want {
		t.Errorf("env file of a claimed sandbox %q, want %q", o.Stdout, want)
	}
}
