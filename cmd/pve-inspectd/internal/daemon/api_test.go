package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

func TestReadTokenSecret(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]struct {
		body, want string
		ok         bool
	}{
		"plain":              {"abc-123\n", "abc-123", true},
		"pveum":              {`{"full-tokenid":"pve-inspectd@pve!daemon","info":{"privsep":"1"},"value":"5f0c-uuid"}`, "5f0c-uuid", true},
		"empty":              {"\n", "", false},
		"json without value": {`{"x":1}`, "", false},
	}
	for name, c := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadTokenSecret(p)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
}

// TestStartAPI wires the sandbox API from the configuration against the
// Proxmox emulator (plain HTTP here; the daemon uses the node CA) and
// serves it on the configured unix socket.
func TestStartAPI(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	_ = os.MkdirAll(run, 0o755)
	fb := pveemu.NewFakeBackend(run)
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(emu)
	t.Cleanup(func() { ts.Close(); _ = emu.Close(); _ = fb.Close() })
	id, secret, err := emu.RootToken("daemon")
	if err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(dir, "pve-token")
	if err := os.WriteFile(secretFile, []byte(`{"full-tokenid":"`+id+`","value":"`+secret+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(`
[node]
id = "pve"
[api]
enabled = true
socket = "` + filepath.Join(dir, "api.sock") + `"
state_dir = "` + filepath.Join(dir, "state") + `"
token_file = "` + filepath.Join(dir, "tokens.json") + `"
qga_dir = "` + run + `"
mgmt_interval = "1h"
[api.proxmox]
url = "` + ts.URL + `/api2/json"
token_id = "` + id + `"
secret_file = "` + secretFile + `"
ca_file = ""
`)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	api, err := StartAPI(ctx, cfg, log, APIDeps{Guests: nil, Iface: "mgmt0"})
	if err == nil || !strings.Contains(err.Error(), "Guests") {
		t.Fatalf("missing guest dialer accepted: %v", err)
	}
	api, err = StartAPI(ctx, cfg, log, APIDeps{Guests: apitest.NewGuests().Dial, Iface: "mgmt0"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- api.Run(rctx) }()
	c := client.NewUnix(cfg.API.Socket)
	deadline := time.Now().Add(10 * time.Second)
	for {
		hl, err := c.Health(ctx)
		if err == nil && hl.Status == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// the management-port rules were converged through the emulator
	deadline = time.Now().Add(10 * time.Second)
	for {
		var rules []map[string]any
		req, _ := http.NewRequest("GET", ts.URL+"/api2/json/nodes/pve/firewall/rules", nil)
		req.Header.Set("Authorization", "PVEAPIToken="+id+"="+secret)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var env struct {
				Data []map[string]any `json:"data"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&env)
			resp.Body.Close()
			rules = env.Data
		}
		if len(rules) == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("management rules: %v", rules)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.API.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left after Run: %v", err)
	}
}
