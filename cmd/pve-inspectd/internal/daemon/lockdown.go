package daemon

import (
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
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
