package pveemu

import (
	"net/url"
	"os"
	"testing"
)

// TestAgentOffStartsNoAgent: a VM whose config has the agent off (agent
// 0, enabled=0, or no agent key) starts without an agent socket, as
// qemu-server's config_to_command adds the qga0 chardev and its
// virtio-serial port only with the agent enabled; with it on the socket
// is there. A NIC of model e1000 (qemu-server's $nic_model_list) is
// taken by the config API and the VM starts on it.
func TestAgentOffStartsNoAgent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		conf   url.Values
		socket bool
	}{
		{"agent 1", url.Values{"agent": {"1"}}, true},
		{"agent 0", url.Values{"agent": {"0"}}, false},
		// a property string's keys come in any order (pve-common
		// JSONSchema.pm parse_property_string): enabled need not lead
		{"agent type=virtio,enabled=1", url.Values{"agent": {"type=virtio,enabled=1"}}, true},
		{"agent fstrim_cloned_disks=1,enabled=0", url.Values{"agent": {"fstrim_cloned_disks=1,enabled=0"}}, false},
		{"agent enabled=0", url.Values{"agent": {"enabled=0"}}, false},
		{"no agent key", url.Values{"delete": {"agent"}}, false},
		{"e1000 NIC, agent off", url.Values{"agent": {"0"}, "net0": {"e1000=BC:24:11:00:01:01,bridge=vnet1,firewall=0"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.setupZone()
			e.clone("101")
			conf := url.Values{"net0": {"virtio,bridge=vnet1,firewall=0"}}
			for k, v := range tc.conf {
				conf[k] = v
			}
			e.ok("PUT", "/nodes/pve/qemu/101/config", conf)
			if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
				t.Fatalf("start: %s", st)
			}
			_, err := os.Stat(e.fb.AgentSocket(101))
			if got := err == nil; got != tc.socket {
				t.Errorf("agent socket there: %v, want %v", got, tc.socket)
			}
			if e.fb.GuestRoot(101) == "" {
				t.Error("the guest is not running")
			}
			if st := e.task("POST", "/nodes/pve/qemu/101/status/stop", nil); st != "OK" {
				t.Fatalf("stop: %s", st)
			}
		})
	}
}
