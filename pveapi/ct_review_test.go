package pveapi

import (
	"context"
	"strings"
	"testing"
)

// TestReviewRawLXCKeysShape pins the input of
// sandbox/TestReviewRawLXCKeyAsProxmoxReturnsIt: pve-container's GET
// .../config returns raw lxc.* lines as one key "lxc" holding [[key,
// value], ...] (API2/LXC/Config.pm vm_config returns.properties.lxc), and
// CTConfigValues hands the engine conf["lxc"] =
// "[[lxc.apparmor.profile unconfined] [lxc.idmap u 0 0 65536]]", no key
// that starts "lxc.". (This test passes: it documents the shape.)
func TestReviewRawLXCKeysShape(t *testing.T) {
	f, c := newFakeServer(t)
	f.cts[9100] = map[string]any{"hostname": "ct-debian", "template": 1, "unprivileged": 1,
		"lxc": [][]string{{"lxc.apparmor.profile", "unconfined"}, {"lxc.idmap", "u 0 0 65536"}}}
	vals, err := c.CTConfigValues(context.Background(), 9100)
	if err != nil {
		t.Fatal(err)
	}
	for k := range vals {
		if strings.HasPrefix(k, "lxc.") {
			t.Errorf("key %q", k)
		}
	}
	if got := vals["lxc"]; got != "[[lxc.apparmor.profile unconfined] [lxc.idmap u 0 0 65536]]" {
		t.Errorf("lxc = %q", got)
	}
}
