package daemon

import (
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/lockdown"
)

// LockdownOptions turns the [lockdown] section into the lockdown
// controller's options; the caller adds Guard (the *firewall.Guard),
// Halter (the *halt.Halter), Metrics and Logger.
func LockdownOptions(s config.LockdownSection) lockdown.Options {
	e := s.Effective()
	return lockdown.Options{
		Marker:    e.Marker,
		Resolver:  e.Resolver,
		BackupDir: e.BackupDir,
		StateFile: e.StateFile,
		Reassert:  e.ReassertInterval,
		Reloader: lockdown.ProcSignaler{Matcher: lockdown.DnsmasqMatcher{
			Exe: e.Dnsmasq.Exe, CmdlineContains: e.Dnsmasq.CmdlineContains,
		}},
	}
}

// StartSwitches returns the switches the guard starts with: the lockdown on
// when the marker is present (or cannot be checked), and fail-closed on too
// when the previous daemon's last published state had it on. The lockdown
// controller's first reconcile then settles them; starting with both off
// would lift the lockdown between the guard's start and that reconcile.
func StartSwitches(marker, stateFile string) firewall.Switches {
	if on, _ := lockdown.MarkerPresent(marker); !on {
		return firewall.Switches{}
	}
	sw := firewall.Switches{Lockdown: true}
	if st, err := lockdown.ReadState(stateFile); err == nil && st.Marker && st.FailClosed {
		sw.FailClosed = true
	}
	return sw
}
