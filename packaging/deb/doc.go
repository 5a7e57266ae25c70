// Package deb holds the Debian packaging of pve-inspectd (nfpm recipe,
// systemd units, maintainer scripts, default configuration, example
// alerting rules; see README.md). It has no Go code of its own: its tests
// build the package with `make deb` and install, upgrade, remove and purge
// it in the systemd container (testvm/sysbox), run lintian on it, and check
// the alerting rules against the metrics the daemon registers.
package deb
