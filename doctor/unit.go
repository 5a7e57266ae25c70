package doctor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

// UnitSettings are the sandboxing settings of the daemon's systemd unit
// that decide whether it can reach a storage's volumes: each key maps to
// its values in order (a list setting may appear more than once; an empty
// assignment resets it, as systemd does).
type UnitSettings struct {
	// Source says where they came from ("systemctl show pve-inspectd.service",
	// a unit file).
	Source string
	values map[string][]string
}

// unitKeys are the settings the check reads.
var unitKeys = []string{"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "DevicePolicy", "DeviceAllow",
	"ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "BindPaths", "TemporaryFileSystem"}

// UnitShowProperties is the -p list for `systemctl show`.
func UnitShowProperties() string { return strings.Join(unitKeys, ",") }

// ParseUnitSettings reads `systemctl show -p ...` output (Key=value lines)
// or a unit file's [Service] section (comments and other sections
// skipped). List settings accumulate; an empty assignment clears them.
func ParseUnitSettings(source string, r io.Reader) (UnitSettings, error) {
	u := UnitSettings{Source: source, values: map[string][]string{}}
	sc := bufio.NewScanner(r)
	section := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line
			continue
		}
		if section != "" && section != "[Service]" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !slices.Contains(unitKeys, k) {
			continue
		}
		if v == "" {
			u.values[k] = nil
			continue
		}
		u.values[k] = append(u.values[k], v)
	}
	if err := sc.Err(); err != nil {
		return u, fmt.Errorf("read %s: %w", source, err)
	}
	return u, nil
}

// last is the value of a single-valued setting ("" = unset).
func (u UnitSettings) last(k string) string {
	vs := u.values[k]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// paths splits a path-list setting into clean paths (systemd's "-" and
// "+" prefixes dropped; BindPaths' "src:dst" keeps dst).
func (u UnitSettings) paths(k string) []string {
	var out []string
	for _, v := range u.values[k] {
		for _, f := range strings.Fields(v) {
			f = strings.TrimLeft(f, "-+")
			if k == "BindPaths" {
				if _, dst, ok := strings.Cut(f, ":"); ok {
					f, _, _ = strings.Cut(dst, ":")
				}
			}
			if strings.HasPrefix(f, "/") {
				out = append(out, path.Clean(f))
			}
		}
	}
	return out
}

func yes(v string) bool {
	switch strings.ToLower(v) {
	case "yes", "true", "1", "on":
		return true
	}
	return false
}

// under says whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// longest returns the longest entry of dirs that p is under ("" = none).
func longest(p string, dirs []string) string {
	best := ""
	for _, d := range dirs {
		if under(p, d) && len(d) > len(best) {
			best = d
		}
	}
	return best
}

// unitDropIn says where an operator changes the unit's sandbox.
const unitDropIn = "a drop-in (systemctl edit pve-inspectd.service; the package's example is /usr/share/doc/pve-inspectd/examples/transfer-storage.conf)"

// WritablePath says whether the unit lets the daemon write below p, and
// if not, why and what to change.
func (u UnitSettings) WritablePath(p string) (ok bool, why, fix string) {
	p = path.Clean(p)
	dropIn := unitDropIn
	if d := longest(p, u.paths("InaccessiblePaths")); d != "" {
		return false, fmt.Sprintf("InaccessiblePaths=%s hides %s", d, p), fmt.Sprintf("remove %s from InaccessiblePaths in %s", d, dropIn)
	}
	rw, ro := longest(p, append(u.paths("ReadWritePaths"), u.paths("BindPaths")...)), longest(p, u.paths("ReadOnlyPaths"))
	if ro != "" && len(ro) >= len(rw) {
		return false, fmt.Sprintf("ReadOnlyPaths=%s makes %s read-only", ro, p), fmt.Sprintf("add ReadWritePaths=%s in %s", p, dropIn)
	}
	if rw != "" {
		return true, fmt.Sprintf("ReadWritePaths=%s", rw), ""
	}
	if yes(u.last("ProtectHome")) || u.last("ProtectHome") == "read-only" || u.last("ProtectHome") == "tmpfs" {
		for _, h := range []string{"/home", "/root", "/run/user"} {
			if under(p, h) {
				return false, fmt.Sprintf("ProtectHome=%s hides %s", u.last("ProtectHome"), p), "move the storage out of " + h + ", or set ProtectHome=no in " + dropIn
			}
		}
	}
	if yes(u.last("PrivateTmp")) && (under(p, "/tmp") || under(p, "/var/tmp")) {
		return false, fmt.Sprintf("PrivateTmp=yes gives the daemon its own %s, not the storage's", p), "move the storage out of /tmp and /var/tmp"
	}
	switch ps := u.last("ProtectSystem"); {
	case ps == "strict":
		if !under(p, "/dev") && !under(p, "/proc") && !under(p, "/sys") {
			return false, fmt.Sprintf("ProtectSystem=strict makes %s read-only and no ReadWritePaths= covers it", p), fmt.Sprintf("add ReadWritePaths=%s in %s", p, dropIn)
		}
	case ps == "full" && (under(p, "/usr") || under(p, "/boot") || under(p, "/efi") || under(p, "/etc")),
		yes(ps) && (under(p, "/usr") || under(p, "/boot") || under(p, "/efi")):
		return false, fmt.Sprintf("ProtectSystem=%s makes %s read-only", ps, p), fmt.Sprintf("add ReadWritePaths=%s in %s", p, dropIn)
	}
	return true, "not protected", ""
}

// BlockDevices says whether the unit lets the daemon open block device
// nodes (an LVM, LVM-thin, ZFS or Ceph volume).
func (u UnitSettings) BlockDevices() (ok bool, why, fix string) {
	dropIn := unitDropIn
	if yes(u.last("PrivateDevices")) {
		return false, "PrivateDevices=yes gives the daemon a /dev without block devices",
			"set PrivateDevices=no and DeviceAllow=block-device-mapper rw (LVM), block-zvol rw (ZFS), block-rbd rw (Ceph) in " + dropIn
	}
	policy := u.last("DevicePolicy")
	if policy == "closed" || policy == "strict" {
		for _, a := range u.values["DeviceAllow"] {
			if f := strings.Fields(a); len(f) > 0 && (strings.HasPrefix(f[0], "block-") || strings.HasPrefix(f[0], "b ") || f[0] == "b" || strings.HasPrefix(f[0], "/dev/")) &&
				(len(f) < 2 || strings.Contains(f[1], "w")) {
				return true, fmt.Sprintf("DevicePolicy=%s with DeviceAllow=%s", policy, a), ""
			}
		}
		return false, fmt.Sprintf("DevicePolicy=%s allows no block device", policy),
			"add DeviceAllow=block-device-mapper rw (LVM), block-zvol rw (ZFS), block-rbd rw (Ceph) in " + dropIn
	}
	return true, "devices not restricted", ""
}

// UnitSource returns the unit's effective settings; ok false means the
// daemon does not run under the unit here (the check is skipped, with
// why).
type UnitSource func(ctx context.Context) (u UnitSettings, ok bool, why string, err error)

// SystemdUnit returns a UnitSource that reads the unit's effective
// settings (drop-ins included) with `systemctl show` through run (the
// host's; a test's container); when systemd does not have the unit
// loaded, from file if given; else the daemon does not run under the unit
// here.
func SystemdUnit(run func(ctx context.Context, argv ...string) ([]byte, error), name, file string) UnitSource {
	return func(ctx context.Context) (UnitSettings, bool, string, error) {
		out, err := run(ctx, "systemctl", "show", name, "-p", "LoadState,"+UnitShowProperties())
		if err == nil && bytes.Contains(out, []byte("LoadState=loaded\n")) {
			u, err := ParseUnitSettings("systemctl show "+name, bytes.NewReader(out))
			return u, true, "", err
		}
		if file != "" {
			f, err := os.Open(file)
			if err != nil {
				return UnitSettings{}, false, "", fmt.Errorf("unit file: %w", err)
			}
			defer f.Close()
			u, err := ParseUnitSettings(file, f)
			return u, true, "", err
		}
		why := fmt.Sprintf("%s is not loaded in systemd", name)
		if err != nil {
			why = fmt.Sprintf("systemctl show %s: %v", name, err)
		}
		return UnitSettings{}, false, why + ": the daemon does not run under its unit here (give --unit-file to check a unit file)", nil
	}
}

// UnitCheck compares the unit's sandbox with the transfer storage's
// volumes: a file storage's images directory must be writable, a block
// storage's device nodes reachable.
func UnitCheck(px API, n Node, src UnitSource) Check {
	return Check{Name: "unit sandbox vs transfer storage", Run: func(ctx context.Context) Outcome {
		if n.TransferStorage == "" {
			return skipf("[api] disk_transfer_storage is off: the daemon opens no volume")
		}
		u, ok, why, err := src(ctx)
		if err != nil {
			return failf("check that systemd can show pve-inspectd.service", "%v", err)
		}
		if !ok {
			return skipf("%s", why)
		}
		s, err := readStorage(ctx, px, n.TransferStorage)
		if err != nil {
			return failf(fmt.Sprintf("define storage %s, or change [api] disk_transfer_storage", n.TransferStorage), "%v", err)
		}
		if s.Block() {
			ok, why, fix := u.BlockDevices()
			if !ok {
				return failf(fix, "%s is %s (block volumes): %s (%s)", s.Storage, s.Type, why, u.Source)
			}
			return passf("%s is %s: %s (%s)", s.Storage, s.Type, why, u.Source)
		}
		if s.Path == "" {
			return failf(fmt.Sprintf("give storage %s a path", s.Storage), "storage %s (%s) has no path", s.Storage, s.Type)
		}
		images := path.Join(s.Path, "images")
		ok, why, fix := u.WritablePath(images)
		if !ok {
			return failf(fix, "%s (%s): %s (%s)", s.Storage, s.Type, why, u.Source)
		}
		return passf("%s writable: %s (%s)", images, why, u.Source)
	}}
}
