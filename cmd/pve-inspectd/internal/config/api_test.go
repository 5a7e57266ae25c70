package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestAPISection(t *testing.T) {
	c, err := Parse(`
[node]
id = "n1"
[api]
enabled = true
listen = "192.0.2.2:8443"
socket_mode = "0660"
default_ttl = "30m"
reaper_interval = "5s"
templates = { debian = 9000 }
disk_transfer_storage = "local"
disk_transfer_threshold = 67108864
exec_own_session = true
[api.caps]
node_vms = 10
owner_sandboxes = 3
[api.events]
max_streams_per_owner = 32
[api.proxmox]
token_id = "pve-inspect@pve!daemon"
`)
	if err != nil {
		t.Fatal(err)
	}
	if c.API.DefaultTTL != 30*time.Minute || c.API.ReaperInterval != 5*time.Second || c.API.Templates["debian"] != 9000 || c.API.Caps.NodeVMs != 10 || c.API.Caps.OwnerSandboxes != 3 || c.API.Events != (APIEvents{MaxStreamsPerToken: 8, MaxStreamsPerOwner: 32, MaxStreams: 256, WriteTimeout: 30 * time.Second}) || c.API.TLSCert != "/etc/pve/local/pve-ssl.pem" ||
		c.API.DiskTransferStorage != "local" || c.API.DiskTransferThreshold != 64<<20 || !c.API.ExecOwnSession {
		t.Errorf("parsed %+v", c.API)
	}
	bad := []struct{ doc, key string }{
		{`[api]` + "\n" + `socket_mode = "0666"`, "api.socket_mode"},
		{`[api]` + "\n" + `socket_mode = "rw"`, "api.socket_mode"},
		{`[api]` + "\n" + `listen = "0.0.0.0:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "nonsense"`, "api.listen"},
		{`[api]` + "\n" + `listen = "[::0]:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "[::]:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "[0:0::0]:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "[::ffff:0.0.0.0]:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "0.0.0.00:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "mgmt.example:8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = ":8443"`, "api.listen"},
		{`[api]` + "\n" + `listen = "224.0.0.1:8443"`, "api.listen"},
		{`[api]` + "\n" + `auto_cidr_pool = "100.64.0.0/16"`, "api.auto_cidr_pool"},
		{`[api]` + "\n" + `auto_cidr_pool = "172.16.0.0/11"`, "api.auto_cidr_pool"},
		{`[api]` + "\n" + `socket = "relative.sock"`, "api.socket"},
		{`[api]` + "\n" + `default_ttl = "48h"`, "api.default_ttl"},
		{`[api]` + "\n" + `auto_cidr_pool = "10.0.0.1/16"`, "api.auto_cidr_pool"},
		{`[api.caps]` + "\n" + `node_vms = -1`, "api.caps.node_vms"},
		{`[api.caps]` + "\n" + `owner_vms = -1`, "api.caps.owner_vms"},
		{`[api.caps]` + "\n" + `owner_memory_mib = -1`, "api.caps.owner_memory_mib"},
		{`[api.events]` + "\n" + `max_streams_per_token = 0`, "api.events.max_streams_per_token"},
		{`[api.events]` + "\n" + `max_streams_per_owner = 4`, "api.events.max_streams_per_owner"},
		{`[api.events]` + "\n" + `max_streams = 8`, "api.events.max_streams_per_owner"},
		{`[api.events]` + "\n" + `write_timeout = "0s"`, "api.events.write_timeout"},
		{`[api]` + "\n" + `enabled = true` + "\n" + `[api.proxmox]` + "\n" + `token_id = "root@pam"`, "api.proxmox.token_id"},
		{`[api]` + "\n" + `enabled = true` + "\n" + `[api.proxmox]` + "\n" + `token_id = "u@pve!d"`, "api.proxmox.token_id"},
		{`[api]` + "\n" + `templates = { "bad name" = 9000 }`, "api.templates.bad name"},
		{`[api]` + "\n" + `bogus = 1`, "api.bogus"},
		{`[api]` + "\n" + `disk_transfer_storage = "Local Disk"`, "api.disk_transfer_storage"},
		{`[api]` + "\n" + `disk_transfer_storage = "../x"`, "api.disk_transfer_storage"},
		{`[api]` + "\n" + `disk_transfer_threshold = 0`, "api.disk_transfer_threshold"},
		{`[api]` + "\n" + `exec_slots = 4` + "\n" + `owner_exec_slots = 5`, "api.owner_exec_slots"},
		{`[api]` + "\n" + `file_slots = 4` + "\n" + `owner_file_slots = 5`, "api.owner_file_slots"},
		{`[api]` + "\n" + `collected_bytes = 1024` + "\n" + `owner_collected_bytes = 1025`, "api.owner_collected_bytes"},
		{`[api]` + "\n" + `guest_buffer_bytes = 1024` + "\n" + `owner_guest_buffer_bytes = 1025`, "api.owner_guest_buffer_bytes"},
	}
	for _, b := range bad {
		_, err := Parse("[node]\nid = \"n\"\n" + b.doc)
		var ke *KeyError
		if !errors.As(err, &ke) || !strings.HasPrefix(ke.Key, b.key) {
			t.Errorf("%q: err %v, want key %s", b.doc, err, b.key)
		}
	}
}

// TestDefaultToken: with the API on and no token_id the default
// configuration is valid (the daemon takes the token the secret file
// names, else daemon-<node>).
func TestDefaultToken(t *testing.T) {
	c, err := Parse("[api]\nenabled = true\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.API.Proxmox.TokenID != "" {
		t.Errorf("default token_id %q, want none", c.API.Proxmox.TokenID)
	}
}

// TestSharedVNets: [api] shared_vnets takes Proxmox vnet ids (none by
// default), each once, and never a trusted interface of the guard; what
// only Proxmox knows is the engine's start check (sandbox
// CheckSharedVNets).
func TestSharedVNets(t *testing.T) {
	c, err := Parse("[node]\nid = \"n\"\n[api]\nshared_vnets = [\"lab\", \"vnetA12\"]\n")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.API.SharedVNets, ",") != "lab,vnetA12" {
		t.Errorf("parsed %q", c.API.SharedVNets)
	}
	if d, err := Parse("[node]\nid = \"n\"\n"); err != nil || len(d.API.SharedVNets) != 0 {
		t.Errorf("default %q %v, want none", d.API.SharedVNets, err)
	}
	for _, b := range []struct{ doc, key string }{
		{`shared_vnets = ["a"]`, "api.shared_vnets[0]"},
		{`shared_vnets = ["lab", "toolongid"]`, "api.shared_vnets[1]"},
		{`shared_vnets = ["9lab"]`, "api.shared_vnets[0]"},
		{`shared_vnets = ["lab-1"]`, "api.shared_vnets[0]"},
		{`shared_vnets = ["lab_"]`, "api.shared_vnets[0]"},
		{`shared_vnets = ["lab", "lab"]`, "api.shared_vnets[1]"},
		{`shared_vnets = ["lab", "vmbr1"]` + "\n[guard]\ntrusted_interfaces = [\"vmbr1\"]", "api.shared_vnets[1]"},
	} {
		_, err := Parse("[node]\nid = \"n\"\n[api]\n" + b.doc)
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != b.key {
			t.Errorf("%q: err %v, want key %s", b.doc, err, b.key)
		}
	}
}
