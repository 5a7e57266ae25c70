package tenantbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

func TestRefusal(t *testing.T) {
	problem := func(status int) error {
		return fmt.Errorf("call: %w", &apitype.Problem{Type: "x", Status: status, Title: http.StatusText(status)})
	}
	for _, tc := range []struct {
		name          string
		err           error
		refused, big  bool
		refusalPrefix string
	}{
		{"none", nil, false, false, ""},
		{"quota", problem(http.StatusTooManyRequests), true, false, "call:"},
		{"node-wide limit", problem(http.StatusServiceUnavailable), true, false, "call:"},
		{"header too large", problem(http.StatusRequestHeaderFieldsTooLarge), false, true, "not a refusal"},
		{"filter bound", problem(http.StatusBadRequest), false, true, "not a refusal"},
		{"forbidden", problem(http.StatusForbidden), false, false, "not a refusal"},
		{"transport", errors.New("connection reset"), false, false, "not a refusal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Refused(tc.err); got != tc.refused {
				t.Errorf("Refused = %v, want %v", got, tc.refused)
			}
			if got := tooLarge(tc.err); got != tc.big {
				t.Errorf("tooLarge = %v, want %v", got, tc.big)
			}
			if got := refusal(tc.err); !strings.HasPrefix(got, tc.refusalPrefix) || (tc.err == nil) != (got == "") {
				t.Errorf("refusal = %q, want prefix %q", got, tc.refusalPrefix)
			}
		})
	}
}

func TestFakeID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := fakeID()
		if len(id) != 8 || !strings.HasPrefix(id, "sb") || strings.Trim(id[2:], "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
			t.Fatalf("fakeID() = %q, not of the daemon's form", id)
		}
		seen[id] = true
	}
	if len(seen) < 99 {
		t.Errorf("%d distinct ids of 100", len(seen))
	}
}

// TestPoisonedEnv runs the poisoned /usr/bin/env and bash on what it
// prints: the exported function must shadow the builtin `true` and leave
// the marker, or the suite's env check could not fail.
func TestPoisonedEnv(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	envPath := filepath.Join(dir, "env")
	if err := os.WriteFile(envPath, []byte(strings.ReplaceAll(poisonedEnv, MarkRan, filepath.Join(dir, "ran"))), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(envPath, "-0").Output()
	if err != nil {
		t.Fatal(err)
	}
	entries := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	for _, want := range []string{"PATH=" + MarkPath + ":", "BASH_ENV=", MarkVar + "=", "BASH_FUNC_true%%="} {
		if !strings.Contains(string(out), want) {
			t.Errorf("poisoned env lacks %q: %q", want, entries)
		}
	}
	cmd := exec.Command(bash, "-c", "true")
	cmd.Env = entries
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err != nil {
		t.Errorf("bash -c true with the poisoned env did not run the injected function: %v", err)
	}
}

// TestFloodScript runs the flood against this machine's loopback with
// small counts: each flood sends what it was asked and says so.
func TestFloodScript(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "flood.py")
	if err := os.WriteFile(script, floodScript, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, script, "seconds=1", "dns=127.0.0.1", "allowed=a.test", "denied=b.test", "dns_n=20",
		"syn=127.0.0.1,127.0.0.1:9", "syn_n=30", "udp=127.0.0.1", "udp_n=40").Output()
	if err != nil {
		t.Fatalf("flood.py: %v", err)
	}
	var counts map[string]int
	if err := json.Unmarshal(out, &counts); err != nil {
		t.Fatalf("flood.py printed %q: %v", out, err)
	}
	for k, want := range map[string]int{"dns_sent": 20, "syn_sent": 30, "udp_sent": 40} {
		if counts[k] != want {
			t.Errorf("%s = %d, want %d (all: %v)", k, counts[k], want, counts)
		}
	}
}
