package config

import (
	"errors"
	"testing"
	"time"
)

func TestLockdownSection(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		badKey    string // "" = valid
	}{
		{"defaults", "", ""},
		{"all keys", `[lockdown]
marker = "/etc/x-lockdown"
resolver = "/run/dnsmasq/other.conf"
backup_dir = "/run/pve-inspectd"
state_file = "/run/pve-inspectd/lockdown.json"
reassert_interval = "30s"
[lockdown.dnsmasq]
exe = "dnsmasq"
cmdline_contains = ["/etc/dnsmasq.d/"]`, ""},
		{"relative marker", "[lockdown]\nmarker = \"marker\"", "lockdown.marker"},
		{"root as backup dir", "[lockdown]\nbackup_dir = \"/\"", "lockdown.backup_dir"},
		{"relative state", "[lockdown]\nstate_file = \"x.json\"", "lockdown.state_file"},
		{"marker is resolver", "[lockdown]\nmarker = \"/run/a\"\nresolver = \"/run/a\"", "lockdown.resolver"},
		{"reassert too short", "[lockdown]\nreassert_interval = \"10ms\"", "lockdown.reassert_interval"},
		{"reassert too long", "[lockdown]\nreassert_interval = \"2h\"", "lockdown.reassert_interval"},
		{"exe path", "[lockdown.dnsmasq]\nexe = \"/usr/sbin/dnsmasq\"", "lockdown.dnsmasq.exe"},
		{"empty substring", "[lockdown.dnsmasq]\ncmdline_contains = [\"/etc/dnsmasq.d/\", \" \"]", "lockdown.dnsmasq.cmdline_contains[1]"},
		{"unknown key", "[lockdown]\nmarkr = \"/x\"", "lockdown.markr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.doc)
			if tc.badKey == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Key != tc.badKey {
				t.Fatalf("Parse error = %v, want a KeyError naming %q", err, tc.badKey)
			}
		})
	}
}

func TestLockdownEffective(t *testing.T) {
	e := LockdownSection{Resolver: "/run/r.conf"}.Effective()
	if e.Marker != DefaultLockdownMarker || e.ReassertInterval != 10*time.Second || e.Dnsmasq.Exe != "dnsmasq" {
		t.Errorf("defaults not filled: %+v", e)
	}
	if len(e.Dnsmasq.CmdlineContains) != 2 || e.Dnsmasq.CmdlineContains[1] != "/run/r.conf" {
		t.Errorf("default matcher %q does not follow the resolver path", e.Dnsmasq.CmdlineContains)
	}
	set := LockdownSection{Dnsmasq: DnsmasqMatchSection{CmdlineContains: []string{"zone"}}}.Effective()
	if len(set.Dnsmasq.CmdlineContains) != 1 {
		t.Errorf("configured matcher replaced: %q", set.Dnsmasq.CmdlineContains)
	}
}
