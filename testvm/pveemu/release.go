package pveemu

import "fmt"

// Release is a Proxmox VE point release ("x.y", what GET /version reports
// as release). The emulator follows the qemu-server of that release where
// they differ (FIDELITY.md, issue 35).
type Release string

const (
	// Release91 is Proxmox VE 9.1 (qemu-server before 9.1.5): agent
	// file-read takes no count, offset or decode.
	Release91 Release = "9.1"
	// Release92 is Proxmox VE 9.2 (qemu-server 9.1.5 and later): agent
	// file-read takes count, offset and decode.
	Release92 Release = "9.2"
)

// releases maps each emulated release to the pve-manager version GET
// /version reports.
var releases = map[Release]string{Release91: "9.1.3", Release92: "9.2.2"}

// ParseRelease checks a release name given on a command line.
func ParseRelease(v string) (Release, error) {
	if _, ok := releases[Release(v)]; !ok {
		return "", fmt.Errorf("pveemu: unknown release %q (want %s or %s)", v, Release91, Release92)
	}
	return Release(v), nil
}

// fileReadSince92 are the agent file-read parameters qemu-server 9.1.5
// added (commits "agent: file-read: Allow specifying max number of bytes
// to read", "... maintaining base64-encoding of content", "... byte offset
// to start reading at"); an older one refuses them as unknown.
var fileReadSince92 = []string{"count", "decode", "offset"}

// latin1 is a Perl byte string as PVE's JSON encoder writes it: each byte
// one character U+0000..U+00FF (UTF-8 on the wire).
func latin1(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}
