package config

import (
	"strings"
	"testing"
	"time"
)

// TestTemplatesSection: builds are off by default; on, they need a user
// and the absolute path of its password file; bad values name the key
// (a build_timeout out of 30m..168h, or not longer than the first boot's
// waits together); a build takes 4h by default.
func TestTemplatesSection(t *testing.T) {
	if c := Default(); c.Templates.Build || c.Templates.BuilderUser != "root@pam" || c.Templates.MaxBuilds != 1 || c.Templates.Bridge != "" || c.Templates.MaxUnpackedGiB != 64 || c.Templates.BuildTimeout != 4*time.Hour {
		t.Errorf("defaults: %+v", c.Templates)
	}
	for _, tc := range []struct {
		doc, key string
	}{
		{"build = true\n", "templates.builder_password_file"},
		{"build = true\nbuilder_password_file = \"pw\"\n", "templates.builder_password_file"},
		{"build = true\nbuilder_password_file = \"/etc/pve-inspectd/builder-pw\"\nbuilder_user = \"pve-inspectd@pve!daemon\"\n", "templates.builder_user"},
		{"build = true\nbuilder_password_file = \"/etc/pve-inspectd/builder-pw\"\nstorage = \"\"\n", "templates.storage"},
		{"bridge = \"vmbr0,firewall=0\"\n", "templates.bridge"},
		{"max_builds = 3\n", "templates.max_builds"},
		{"max_unpacked_gib = 0\n", "templates.max_unpacked_gib"},
		{"max_unpacked_gib = 2048\n", "templates.max_unpacked_gib"},
		{"agent_wait = \"10s\"\n", "templates.agent_wait"},
		{"build_timeout = \"10m\"\n", "templates.build_timeout"},
		{"build_timeout = \"200h\"\n", "templates.build_timeout"},
		{"build_timeout = \"-1h\"\n", "templates.build_timeout"},
		{"build_timeout = \"1h\"\n", "templates.build_timeout"}, // not more than agent_wait + cloud_init_wait
		{"build_timeout = \"3h\"\nagent_wait = \"2h\"\ncloud_init_wait = \"1h\"\n", "templates.build_timeout"},
		{"lock_dir = \"run\"\n", "templates.lock_dir"},
		{"nope = 1\n", "templates.nope"},
		{"mirror = \"ftp://mirror.lan/cloud/\"\n", "templates.mirror"},
		{"mirror = \"http://user:pw@mirror.lan/cloud/\"\n", "templates.mirror"},
		{"mirror = \"http://mirror.lan/cloud/?k=v\"\n", "templates.mirror"},
		{"mirror = \"http://169.254.169.254/\"\n", "templates.mirror"},
		{"state_dir = \"builds\"\n", "templates.state_dir"},
	} {
		_, err := Parse("[templates]\n" + tc.doc)
		if err == nil || !strings.Contains(err.Error(), `"`+tc.key+`"`) {
			t.Errorf("%q: %v, want an error naming %s", tc.doc, err, tc.key)
		}
	}
	c, err := Parse("[templates]\nbuild = true\nbuilder_password_file = \"/etc/pve-inspectd/builder-pw\"\nmax_builds = 2\nmirror = \"http://10.0.0.8/cloud/\"\nmax_unpacked_gib = 16\nbuild_timeout = \"12h\"\n")
	if err != nil || !c.Templates.Build || c.Templates.MaxBuilds != 2 || c.Templates.MaxUnpackedGiB != 16 || c.Templates.Mirror != "http://10.0.0.8/cloud/" || c.Templates.StateDir != "/var/lib/pve-inspectd/template-builds" || c.Templates.BuildTimeout != 12*time.Hour {
		t.Errorf("builds on: %+v %v", c.Templates, err)
	}
}
