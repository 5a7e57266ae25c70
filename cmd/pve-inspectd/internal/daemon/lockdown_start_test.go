package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/lockdown"
)

func TestStartSwitches(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marker bool
		state  *lockdown.State
		want   firewall.Switches
	}{
		{"no marker", false, &lockdown.State{Marker: true, FailClosed: true}, firewall.Switches{}},
		{"marker, no state", true, nil, firewall.Switches{Lockdown: true}},
		{"marker, enforced before", true, &lockdown.State{Marker: true, Enforced: true}, firewall.Switches{Lockdown: true}},
		{"marker, failed closed before", true, &lockdown.State{Marker: true, FailClosed: true}, firewall.Switches{Lockdown: true, FailClosed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			marker, state := filepath.Join(dir, "marker"), filepath.Join(dir, "lockdown.json")
			if tc.marker {
				if err := os.WriteFile(marker, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.state != nil {
				if err := lockdown.WriteState(state, *tc.state); err != nil {
					t.Fatal(err)
				}
			}
			if got := StartSwitches(marker, state); got != tc.want {
				t.Fatalf("StartSwitches = %+v, want %+v", got, tc.want)
			}
		})
	}
}
