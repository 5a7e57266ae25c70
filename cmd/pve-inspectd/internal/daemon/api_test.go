package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
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

// TestReadToken: the daemon's token id is token_id when set, else the one
// the secret file names (pve-access-setup's JSON: an upgrade keeps its
// token), else pve-access-setup's default for the node; a token_id the
// file's secret is not for is an error naming both.
func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	js := func(id string) string { return `{"full-tokenid":"` + id + `","info":{"privsep":"1"},"value":"s"}` }
	for _, c := range []struct {
		name, body, configured, node string
		want, err                    string
	}{
		{"plain secret, default for the node", "s\n", "", "pve1", "pve-inspectd@pve!daemon-pve1", ""},
		{"plain secret, configured", "s", "u@pve!t1", "pve1", "u@pve!t1", ""},
		{"file names its token", js("pve-inspectd@pve!daemon-pve2"), "", "pve1", "pve-inspectd@pve!daemon-pve2", ""},
		{"upgrade from the single token", js("pve-inspectd@pve!daemon"), "", "pve1", "pve-inspectd@pve!daemon", ""},
		{"configured as the file says", js("u@pve!t1"), "u@pve!t1", "pve1", "u@pve!t1", ""},
		{"configured another", js("u@pve!t1"), "u@pve!t2", "pve1", "", `holds the secret of "u@pve!t1"`},
		{"no name anywhere", "s", "", "", "", "no [api.proxmox] token_id"},
		{"empty file", "", "", "pve1", "", "empty"},
		{"file names a password login", js("root@pam"), "", "pve1", "", "not an API token id"},
		{"file names garbage", js("a b!x"), "", "pve1", "", "not an API token id"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
		if err := os.WriteFile(p, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		id, secret, err := ReadToken(p, c.configured, c.node)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %q %v, want an error with %q", c.name, id, err, c.err)
		case c.err == "" && (err != nil || id != c.want || secret != "s"):
			t.Errorf("%s: %q %q %v, want %q", c.name, id, secret, err, c.want)
		}
	}
}

// pveBed is the Proxmox emulator behind an address that is first down
// (nothing listens) and comes up with up.
type pveBed struct {
	addr   string
	emu    *pveemu.Server
	ts     *httptest.Server
	id     string
	secret string
	run    string
}

func newPVEBed(t *testing.T) *pveBed {
	t.Helper()
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	_ = os.MkdirAll(run, 0o755)
	fb := pveemu.NewFakeBackend(run)
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close(); _ = fb.Close() })
	// The daemon's token as pve-access-setup creates it, and the cluster
	// firewall on as root turns it on.
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{})
	if err != nil {
		t.Fatal(err)
	}
	emu.EnableClusterFirewall()
	// An address nobody listens on: bound once to pick a free port, closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return &pveBed{addr: addr, emu: emu, id: id, secret: secret, run: run}
}

// up starts serving the emulator on the bed's address.
func (b *pveBed) up(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", b.addr)
	if err != nil {
		t.Fatalf("bring proxmox up on %s: %v", b.addr, err)
	}
	b.ts = httptest.NewUnstartedServer(b.emu)
	b.ts.Listener = ln
	b.ts.Start()
	t.Cleanup(b.ts.Close)
}

// config is an [api] configuration against the bed, with its files in dir.
func (b *pveBed) config(t *testing.T, dir string) config.Config {
	t.Helper()
	secretFile := filepath.Join(dir, "pve-token")
	if err := os.WriteFile(secretFile, []byte(`{"full-tokenid":"`+b.id+`","value":"`+b.secret+`"}`), 0o600); err != nil {
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
qga_dir = "` + b.run + `"
[api.proxmox]
url = "http://` + b.addr + `/api2/json"
token_id = "` + b.id + `"
secret_file = "` + secretFile + `"
ca_file = ""
`)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// nodeRules counts the node firewall rules in the emulator.
func (b *pveBed) nodeRules() int {
	req, _ := http.NewRequest("GET", b.ts.URL+"/api2/json/nodes/pve/firewall/rules", nil)
	req.Header.Set("Authorization", "PVEAPIToken="+b.id+"="+b.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var env struct {
		Data []map[string]any `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&env)
	return len(env.Data)
}

// nodeRuleIfaces lists the interfaces of the node firewall rules.
func (b *pveBed) nodeRuleIfaces() string {
	req, _ := http.NewRequest("GET", b.ts.URL+"/api2/json/nodes/pve/firewall/rules", nil)
	req.Header.Set("Authorization", "PVEAPIToken="+b.id+"="+b.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var env struct {
		Data []struct {
			Iface string `json:"iface"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&env)
	var out []string
	for _, r := range env.Data {
		out = append(out, r.Iface)
	}
	return strings.Join(out, ",")
}

// waitFor polls cond every 20ms until it holds or a minute passes.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAPIProxmoxDownAtStart starts the sandbox API while nothing listens
// at the Proxmox address: Run does not fail, the unix socket answers 503
// `unavailable`, and once Proxmox comes up the API reconciles, answers
// healthy. Stopping removes the socket.
func TestAPIProxmoxDownAtStart(t *testing.T) {
	bed := newPVEBed(t)
	cfg := bed.config(t, t.TempDir())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api, err := NewAPI(cfg, log, APIDeps{Guests: apitest.NewGuests().Dial, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- api.Run(rctx) }()
	c := client.NewUnix(cfg.API.Socket)
	waitFor(t, "503 while proxmox is down", func() error {
		_, err := c.Health(ctx)
		if client.IsProblem(err, apitype.ProblemUnavailable) && strings.Contains(err.Error(), "connection refused") {
			return nil
		}
		return fmt.Errorf("want unavailable naming the refused connection, got %v", err)
	})
	select {
	case err := <-done:
		t.Fatalf("Run ended while proxmox was down: %v", err)
	default:
	}
	bed.up(t)
	waitFor(t, "healthy once proxmox is up", func() error {
		h, err := c.Health(ctx)
		if err == nil && h.Status != "ok" {
			err = fmt.Errorf("status %q", h.Status)
		}
		return err
	})
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.API.Socket); !os.IsNotExist(err) {
		t.Errorf("socket left after Run: %v", err)
	}
}

// TestAPIMissingGuestsRetried: a server that cannot be built (no guest
// dialer) leaves the API answering 503 with the reason; Run keeps going.
func TestAPIMissingGuestsRetried(t *testing.T) {
	bed := newPVEBed(t)
	bed.up(t)
	cfg := bed.config(t, t.TempDir())
	api, err := NewAPI(cfg, slog.New(slog.DiscardHandler), APIDeps{RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Run(ctx) }()
	c := client.NewUnix(cfg.API.Socket)
	waitFor(t, "503 naming the missing dialer", func() error {
		_, err := c.Health(ctx)
		if client.IsProblem(err, apitype.ProblemUnavailable) && strings.Contains(err.Error(), "Guests") {
			return nil
		}
		return fmt.Errorf("got %v", err)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
