package daemon

import (
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
)

// TestEveryNotrackedPortHasAnOutRule: the guard takes every port of
// [guard] management_ports (22, 8006, the ones an operator adds, and the
// daemon's own listeners: the API and the metrics listener,
// config.addListenerPorts) out of connection tracking on the management
// interfaces (mgmt-notrack-in / raw_out). The node OUT rules that let
// the untracked replies pass a host firewall's policy_out DROP (commit
// 1913b2a) must cover every one of them, not only 8006, 22 and the
// sandbox API port: with the metrics listener on the management address
// (to be scraped from outside) or any port the operator adds, the node's
// replies from it are untracked, not ESTABLISHED, and policy_out would
// drop them, locking the operator out of that service.
func TestEveryNotrackedPortHasAnOutRule(t *testing.T) {
	cfg, err := config.Parse("[metrics]\nlisten = \"0.0.0.0:9474\"\n[guard]\nmanagement_ports = [22, 8006, 3128]\n")
	if err != nil {
		t.Fatal(err)
	}
	conv := mgmtConverger(nil, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	out := map[string]bool{}
	for _, r := range conv.Desired("vmbr0") {
		if r.Type == "out" && r.Proto == "tcp" {
			out[r.SPort] = true
		}
	}
	for _, p := range cfg.Guard.ManagementPorts {
		if !out[strconv.Itoa(p)] {
			t.Errorf("management port %d is not tracked by the guard but has no node OUT rule: its replies meet policy_out DROP", p)
		}
	}
}
