package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestGuardDefaults(t *testing.T) {
	c, err := Parse("")
	if err != nil {
		t.Fatal(err)
	}
	if c.Guard.DnsmasqUser != "dnsmasq" || c.Guard.VerifyEvery() != 30*time.Second ||
		c.Guard.ProcRoot != "/proc" || c.Metrics.Listen != "127.0.0.1:9474" ||
		c.Guard.SDNConfig != "/etc/pve/sdn/.running-config" || !c.Guard.MgmtRules || c.Guard.MgmtEvery() != time.Minute {
		t.Errorf("defaults: %+v %+v", c.Guard, c.Metrics)
	}
}

// TestMgmtKeysOldPlace: files written when the management-port keys were
// in [api] still load, and mean the same.
func TestMgmtKeysOldPlace(t *testing.T) {
	c, err := Parse("[api]\nmgmt_rules = false\nmgmt_interval = \"5m\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Guard.MgmtRules || c.Guard.MgmtEvery() != 5*time.Minute || c.API.MgmtRules != nil {
		t.Errorf("old keys: guard %v %v, api %v", c.Guard.MgmtRules, c.Guard.MgmtEvery(), c.API.MgmtRules)
	}
	if _, err := Parse("[api]\nmgmt_interval = \"soon\"\n"); err == nil || !strings.Contains(err.Error(), "mgmt_interval") {
		t.Errorf("bad old interval: %v", err)
	}
}

func TestGuardSectionParses(t *testing.T) {
	c, err := Parse(`
[guard]
metadata4 = ["192.0.0.192/32", "198.51.100.7"]
metadata6 = ["fd00:ec2::253/128"]
private4_allow = ["10.20.0.0/16"]
trusted_interfaces = ["vmbr1"]
zones = { zone1 = ["vnet1", "vnet2"] }
dnsmasq_user = "123"
verify_interval = "5s"
proc_root = "/host/proc"
state_dir = "/run/x"
sdn_config = ""
[metrics]
listen = "[::1]:9000"
`)
	if err != nil {
		t.Fatal(err)
	}
	g := c.Guard
	if len(g.Metadata4Prefixes()) != 2 || g.Metadata4Prefixes()[1].String() != "198.51.100.7/32" ||
		len(g.Metadata6Prefixes()) != 1 || len(g.Private4AllowPrefixes()) != 1 ||
		g.VerifyEvery() != 5*time.Second || g.Zones["zone1"][1] != "vnet2" || g.SDNConfig != "" || c.Metrics.Listen != "[::1]:9000" {
		t.Errorf("parsed: %+v %+v", g, c.Metrics)
	}
}

func TestGuardFloodKeys(t *testing.T) {
	d := Default().Guard
	if !slices.Equal(d.ManagementPorts, []int{22, 8006, 9474}) || d.ConnLimit != 2048 || d.PacketRate != 50000 {
		t.Errorf("defaults: ports %v conn_limit %d packet_rate %d", d.ManagementPorts, d.ConnLimit, d.PacketRate)
	}
	c, err := Parse(`
[guard]
management_ports = [2222]
conn_limit = 100
port_arp_rate = 5
[metrics]
listen = "127.0.0.1:9100"
[api]
listen = "192.0.2.2:8443"
`)
	if err != nil {
		t.Fatal(err)
	}
	// the daemon's listeners are management ports whatever the file says
	if g := c.Guard; !slices.Equal(g.ManagementPorts, []int{2222, 8443, 9100}) || g.ConnLimit != 100 || g.PortARPRate != 5 || g.PortARPBurst != 200 {
		t.Errorf("parsed: %+v", g)
	}
	for _, tc := range []struct{ doc, key string }{
		{"[guard]\nmanagement_ports = [0]", "guard.management_ports[0]"},
		{"[guard]\nmanagement_ports = [70000]", "guard.management_ports[0]"},
		{"[guard]\nconn_limit = 0", "guard.conn_limit"},
		{"[guard]\nnode_conn_limit = 0", "guard.node_conn_limit"},
		{"[guard]\ndns_rate = 0", "guard.dns_rate"},
		{"[guard]\ndns_burst = 100000000", "guard.dns_burst"},
		{"[guard]\npacket_burst = -1", "guard.packet_burst"},
		{"[guard]\nport_broadcast_rate = 100000000", "guard.port_broadcast_rate"},
	} {
		var ke *KeyError
		if _, err := Parse(tc.doc); !errors.As(err, &ke) || ke.Key != tc.key {
			t.Errorf("%q: %v, want a KeyError for %s", tc.doc, err, tc.key)
		}
	}
}

func TestGuardBadValuesNameTheKey(t *testing.T) {
	cases := []struct{ doc, key string }{
		{`[guard]
metadata4 = ["fd00::1"]`, "guard.metadata4[0]"},
		{`[guard]
metadata4 = ["10.0.0.0/8", "nonsense"]`, "guard.metadata4[1]"},
		{`[guard]
metadata6 = ["10.0.0.1"]`, "guard.metadata6[0]"},
		{`[guard]
private4_allow = ["::/0"]`, "guard.private4_allow[0]"},
		{`[guard]
trusted_interfaces = ["way-too-long-interface-name"]`, "guard.trusted_interfaces[0]"},
		{`[guard]
zones = { z = ["a/b"] }`, "guard.zones.z[0]"},
		{`[guard]
sdn_config = "etc/pve/sdn/.running-config"`, "guard.sdn_config"},
		{`[guard]
mgmt_interval = "100ms"`, "guard.mgmt_interval"},
		{`[guard]
mgmt_interval = "soon"`, "guard.mgmt_interval"},
		{`[guard]
dnsmasq_user = ""`, "guard.dnsmasq_user"},
		{`[guard]
verify_interval = "often"`, "guard.verify_interval"},
		{`[guard]
verify_interval = "10ms"`, "guard.verify_interval"},
		{`[guard]
proc_root = "proc"`, "guard.proc_root"},
		{`[guard]
state_dir = ""`, "guard.state_dir"},
		{`[metrics]
listen = "9474"`, "metrics.listen"},
		{`[metrics]
listen = "127.0.0.1:99999"`, "metrics.listen"},
		{`[metrics]
listen = "example.com:80"`, "metrics.listen"},
		{`[guard]
bogus = 1`, "guard.bogus"},
	}
	for _, tc := range cases {
		_, err := Parse(tc.doc)
		var ke *KeyError
		if !errors.As(err, &ke) || ke.Key != tc.key {
			t.Errorf("Parse(%q) = %v, want a KeyError for %s", tc.doc, err, tc.key)
		}
	}
}

// FuzzParse feeds arbitrary documents to the parser: it must never panic,
// and whatever it accepts must be usable (parsed accessors agree with the
// raw lists); whatever it rejects is an error naming a key or a line.
func FuzzParse(f *testing.F) {
	f.Add("")
	f.Add("[guard]\nmetadata4 = [\"1.2.3.4/32\"]\n")
	f.Add("[guard]\ntrusted_interfaces = [\"vmbr1\"]\nzones = { z = [\"v1\"] }\n")
	f.Add("[metrics]\nlisten = \"127.0.0.1:1\"\n")
	f.Add("[guard]\nverify_interval = \"1h\"\nmetadata6 = [\"::1\"]\n")
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := Parse(doc)
		if err != nil {
			var ke *KeyError
			if !errors.As(err, &ke) && !strings.HasPrefix(err.Error(), "parse config") {
				t.Fatalf("error neither names a key nor is a parse error: %v", err)
			}
			return
		}
		g := c.Guard
		if len(g.Metadata4Prefixes()) != len(g.Metadata4) || len(g.Metadata6Prefixes()) != len(g.Metadata6) ||
			len(g.Private4AllowPrefixes()) != len(g.Private4Allow) {
			t.Fatalf("accepted prefixes that do not parse: %+v", g)
		}
		if d := g.VerifyEvery(); d < time.Second {
			t.Fatalf("accepted verify_interval %q", g.VerifyInterval)
		}
		for _, p := range g.Metadata4Prefixes() {
			if !p.Addr().Is4() {
				t.Fatalf("accepted non-IPv4 metadata4 %s", p)
			}
		}
	})
}
