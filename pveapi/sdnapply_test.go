package pveapi

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

func TestWarningNode(t *testing.T) {
	cases := []struct {
		warn, node string
		ok         bool
	}{
		// run_command's failure of reloadnetworkall's per-node pvesh
		{"command 'pvesh set /nodes/pve2/network --regenerate-frr 0' failed: exit code 255", "pve2", true},
		{"command 'pvesh set /nodes/node-b.lab/network --regenerate-frr 1' failed: got signal 9", "node-b.lab", true},
		// the per-node prefix the worker prints (and the emulator uses)
		{"pve: reloading network config failed", "pve", true},
		{"pve-2: apply zone sbx: dnsmasq failed", "pve-2", true},
		// no node named
		{"unable to parse worker upid ''", "", false},
		{"Could not run before_regenerate for DHCP plugin dnsmasq", "", false},
		{"", "", false},
		{"-bad: x", "", false},
	}
	for _, tc := range cases {
		node, ok := warningNode(tc.warn)
		if node != tc.node || ok != tc.ok {
			t.Errorf("warningNode(%q) = %q, %v; want %q, %v", tc.warn, node, ok, tc.node, tc.ok)
		}
	}
}

func FuzzWarningNode(f *testing.F) {
	f.Add("command 'pvesh set /nodes/pve2/network --regenerate-frr 0' failed: exit code 255")
	f.Add("pve: x")
	f.Fuzz(func(t *testing.T, w string) {
		node, ok := warningNode(w)
		if ok != (node != "") {
			t.Fatalf("%q: node %q ok %v", w, node, ok)
		}
		if ok && !strings.Contains(w, node) {
			t.Fatalf("%q: node %q not in the warning", w, node)
		}
	})
}

// TestApplySDNWarningsPerNode: reloadnetworkall warns per node; only a
// warning about this node (pve1) or about no known member fails the apply,
// another node's is logged.
func TestApplySDNWarningsPerNode(t *testing.T) {
	const other = "command 'pvesh set /nodes/pve2/network --regenerate-frr 0' failed: exit code 255"
	const mine = "command 'pvesh set /nodes/pve1/network --regenerate-frr 0' failed: exit code 255"
	cases := []struct {
		name    string
		warns   []string
		wantErr string // "" for success
		wantLog string
	}{
		{"another node down", []string{other}, "", "another cluster node failed its network reload"},
		{"this node down", []string{mine}, "exit code 255", ""},
		{"both", []string{other, mine}, "/nodes/pve1/network", "node=pve2"},
		{"a node that is no member", []string{"pve3: reloading network config failed"}, "pve3: reloading", ""},
		{"a warning naming no node", []string{"unable to parse worker upid ''"}, "unable to parse worker upid", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f, c := newFakeServer(t)
			var logs bytes.Buffer
			c.log = slog.New(slog.NewTextHandler(&logs, nil))
			f.nodes = []string{"pve1", "pve2"}
			f.warns = tc.warns
			f.failOp["reloadnetworkall"] = "WARNINGS: " + string(rune('0'+len(tc.warns)))
			err := c.ApplySDN(ctx)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("apply: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("apply: %v, want an error with %q", err, tc.wantErr)
			}
			if tc.wantErr != "" && strings.Contains(err.Error(), "/nodes/pve2/") {
				t.Errorf("the other node's warning fails this node's apply: %v", err)
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log %q, want %q", logs.String(), tc.wantLog)
			}
		})
	}
}

// TestApplySDNForeignPending: an apply commits every client's pending
// edits; the client says which ones were not its own, and whose they
// look like.
func TestApplySDNForeignPending(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f, c := newFakeServer(t)
	var logs bytes.Buffer
	c.log = slog.New(slog.NewTextHandler(&logs, nil))
	if err := c.CreateZone(ctx, sandbox.ZoneSpec{ID: "sbz"}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateVNet(ctx, sandbox.VNetSpec{ID: "sbv0", Zone: "sbz", Alias: "pvei-n-pve1 pvei-s-sbz"}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.zones["office"] = true
	f.zones["sbq1w2e3"] = true
	f.vnets["sbq1w2v0"] = map[string]any{"vnet": "sbq1w2v0", "zone": "sbq1w2e3", "alias": "pvei-n-pve2 pvei-s-sbq1w2e3", "type": "vnet"}
	f.mu.Unlock()
	if err := c.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
	got := logs.String()
	for _, want := range []string{"zone office (new, not pve-inspect's)", "zone sbq1w2e3 (new, another pve-inspect daemon's sandbox)",
		"vnet sbq1w2v0 (new, another pve-inspect daemon's sandbox)"} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	for _, own := range []string{"zone sbz ", "vnet sbv0 "} {
		if strings.Contains(got, own) {
			t.Errorf("own edit %q reported as foreign: %q", own, got)
		}
	}
	// Applied: a second apply has nothing foreign to say.
	logs.Reset()
	if err := c.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "did not make") {
		t.Errorf("second apply: %q", logs.String())
	}
}

// TestNodeDownIsClear: a node whose API does not answer at all makes each
// call fail saying so.
func TestNodeDownIsClear(t *testing.T) {
	_, c := newFakeServer(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	down, err := New(Options{URL: srv.URL + "/api2/json", TokenID: "pve-inspect@pve!daemon", Secret: "s3cret", Node: "pve2", TaskPoll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = down.ListVMs(ctx)
	if err == nil || !strings.Contains(err.Error(), "does not answer (is the node down?)") || !strings.Contains(err.Error(), strings.TrimPrefix(srv.URL, "http://")) {
		t.Fatalf("list VMs of a node that is down: %v", err)
	}
	// A node that answers is not reported down.
	if _, err := c.ListVMs(ctx); err != nil {
		t.Fatal(err)
	}
}
