package sandboxapi_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

func TestEnvFile(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"B": "2", "A": "1"}, "A='1'\nB='2'\n"},
		{map[string]string{"K": "it's $HOME `x`"}, "K='it'\\''s $HOME `x`'\n"},
		{map[string]string{}, ""},
	} {
		if got := string(apitype.EnvFile(tc.env)); got != tc.want {
			t.Errorf("EnvFile(%v) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

// TestCreateEnv: a create's env lands in every VM at GuestEnvPath and is
// never stored in the state file or returned; bad env is refused and
// creates nothing.
func TestCreateEnv(t *testing.T) {
	e := newEnv(t, nil)
	const secret = "sk-not-a-real-key"
	req := twoVMs()
	req.Env = map[string]string{"ANTHROPIC_API_KEY": secret}
	sb := e.create(req)
	for _, v := range sb.VMs {
		res, err := e.c.Exec(e.ctx(), sb.ID, v.Name, apitype.ExecRequest{Argv: []string{"cat", apitype.GuestEnvPath}})
		if err != nil || string(res.Stdout) != "ANTHROPIC_API_KEY='"+secret+"'\n" {
			t.Errorf("vm %s env file: %+v %v", v.Name, res, err)
		}
	}
	got, err := e.c.Get(e.ctx(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(got); strings.Contains(string(b), secret) {
		t.Error("get returns the secret")
	}
	files, _ := filepath.Glob(filepath.Join(e.opts.StateDir, "*"))
	for _, f := range files {
		if b, _ := os.ReadFile(f); strings.Contains(string(b), secret) {
			t.Errorf("%s stores the secret", f)
		}
	}
	for _, env := range []map[string]string{{"1BAD": "x"}, {"K": "a\x00b"}, {"": "x"}} {
		req := twoVMs()
		req.Env = env
		_, err := e.c.Create(e.ctx(), req)
		if !client.IsProblem(err, apitype.ProblemInvalidRequest) || strings.Contains(err.Error(), "a\x00b") {
			t.Errorf("env %q: %v", env, err)
		}
	}
	if l, _ := e.c.List(e.ctx()); len(l) != 1 {
		t.Errorf("%d sandboxes after refused creates, want 1", len(l))
	}
}
