package mcpserver_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

func TestParseEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want map[string]string
		err  string
	}{
		{"plain", "A=1\nB = two words \n", map[string]string{"A": "1", "B": "two words"}, ""},
		{"comments and export", "# keys\n\nexport OPENAI_API_KEY='sk-x'\nANTHROPIC_API_KEY=\"sk-y\"\n", map[string]string{"OPENAI_API_KEY": "sk-x", "ANTHROPIC_API_KEY": "sk-y"}, ""},
		{"empty value", "E=\n", map[string]string{"E": ""}, ""},
		{"equals in value", "U=a=b\n", map[string]string{"U": "a=b"}, ""},
		{"no equals", "JUSTAKEY\n", nil, "line 1"},
		{"bad name", "1A=x\n", nil, "line 1"},
		{"duplicate", "A=1\nA=2\n", nil, "line 2: A given twice"},
		{"nul", "A=x\x00y\n", nil, "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mcpserver.ParseEnv([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseEnv: any input parses or fails; parsed keys and values are
// clean, and what parses renders (EnvFile) to a file that parses back the
// same when no value holds a single quote (EnvFile escapes those for sh).
func FuzzParseEnv(f *testing.F) {
	for _, s := range []string{"A=1\n", "export K='v'\n", "# c\nB=\"x y\"\n", "A=1\nA=2", "=", "K=it's"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		env, err := mcpserver.ParseEnv(b)
		if err != nil {
			return
		}
		for k, v := range env {
			if k == "" || strings.ContainsAny(k, "= \n") {
				t.Fatalf("bad key %q", k)
			}
			if strings.ContainsAny(v, "\n\x00") {
				t.Fatalf("value of %s holds a newline or NUL", k)
			}
		}
		back, err := mcpserver.ParseEnv(apitype.EnvFile(env))
		if err != nil {
			t.Fatalf("rendered file does not parse: %v", err)
		}
		quoted := false
		for _, v := range env {
			quoted = quoted || strings.Contains(v, "'")
		}
		if !quoted && !maps.Equal(back, env) {
			t.Fatalf("round trip %v -> %v", env, back)
		}
	})
}
