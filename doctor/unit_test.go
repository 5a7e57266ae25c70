package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

func unit(t *testing.T, text string) UnitSettings {
	t.Helper()
	u, err := ParseUnitSettings("test.service", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestUnitWritablePath(t *testing.T) {
	const images = "/var/lib/vz/images"
	for _, tc := range []struct {
		name, unit string
		ok         bool
		why, fix   string
	}{
		{"no sandbox", "[Service]\nExecStart=/usr/bin/pve-inspectd run\n", true, "not protected", ""},
		{"strict", "[Service]\nProtectSystem=strict\nReadWritePaths=/run\n", false, "ProtectSystem=strict makes /var/lib/vz/images read-only", "ReadWritePaths=/var/lib/vz/images"},
		{"strict, path allowed", "[Service]\nProtectSystem=strict\nReadWritePaths=/run -/var/lib/vz/images\n", true, "ReadWritePaths=/var/lib/vz/images", ""},
		{"strict, parent allowed", "[Service]\nProtectSystem=strict\nReadWritePaths=/var/lib/vz\n", true, "ReadWritePaths=/var/lib/vz", ""},
		{"reset list", "[Service]\nProtectSystem=strict\nReadWritePaths=/var/lib/vz\nReadWritePaths=\nReadWritePaths=/run\n", false, "ProtectSystem=strict", "ReadWritePaths=/var/lib/vz/images"},
		{"read-only below a writable", "[Service]\nReadWritePaths=/var\nReadOnlyPaths=/var/lib\n", false, "ReadOnlyPaths=/var/lib", "ReadWritePaths=/var/lib/vz/images"},
		{"inaccessible", "[Service]\nReadWritePaths=/var/lib/vz\nInaccessiblePaths=/var/lib/vz/images\n", false, "InaccessiblePaths=/var/lib/vz/images", "remove /var/lib/vz/images"},
		{"full leaves /var", "[Service]\nProtectSystem=full\n", true, "not protected", ""},
		{"other section ignored", "[Install]\nProtectSystem=strict\n[Service]\nProtectSystem=no\n", true, "not protected", ""},
		{"systemctl show", "ProtectSystem=strict\nReadWritePaths=/run /var/lib/vz\nPrivateDevices=yes\n", true, "ReadWritePaths=/var/lib/vz", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why, fix := unit(t, tc.unit).WritablePath(images)
			if ok != tc.ok || !strings.Contains(why, tc.why) || !strings.Contains(fix, tc.fix) || !ok && fix == "" {
				t.Errorf("WritablePath = %v, %q, %q; want %v, %q, %q", ok, why, fix, tc.ok, tc.why, tc.fix)
			}
		})
	}
	for _, p := range []struct {
		path, unit, why string
	}{
		{"/home/vz/images", "[Service]\nProtectHome=yes\n", "ProtectHome=yes"},
		{"/tmp/vz/images", "[Service]\nPrivateTmp=yes\n", "PrivateTmp=yes"},
		{"/usr/local/vz/images", "[Service]\nProtectSystem=yes\n", "ProtectSystem=yes"},
	} {
		if ok, why, _ := unit(t, p.unit).WritablePath(p.path); ok || !strings.Contains(why, p.why) {
			t.Errorf("%s under %q: %v %q, want refused by %s", p.path, p.unit, ok, why, p.why)
		}
	}
}

func TestUnitBlockDevices(t *testing.T) {
	for _, tc := range []struct {
		name, unit string
		ok         bool
		why        string
	}{
		{"open", "[Service]\n", true, "not restricted"},
		{"private devices", "[Service]\nPrivateDevices=yes\nDeviceAllow=block-device-mapper rw\n", false, "PrivateDevices=yes"},
		{"closed", "[Service]\nDevicePolicy=closed\n", false, "DevicePolicy=closed allows no block device"},
		{"closed, read-only allow", "[Service]\nDevicePolicy=closed\nDeviceAllow=block-device-mapper r\n", false, "allows no block device"},
		{"closed with mapper", "[Service]\nDevicePolicy=closed\nDeviceAllow=block-device-mapper rw\n", true, "DeviceAllow=block-device-mapper rw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why, fix := unit(t, tc.unit).BlockDevices()
			if ok != tc.ok || !strings.Contains(why, tc.why) || !ok && !strings.Contains(fix, "DeviceAllow=") {
				t.Errorf("BlockDevices = %v, %q, %q; want %v, %q", ok, why, fix, tc.ok, tc.why)
			}
		})
	}
}

// TestUnitCheck runs the check against the emulated node: its transfer
// storage "local" is a dir storage whose path Proxmox reports; the
// shipped unit's ProtectSystem=strict must leave its images writable.
func TestUnitCheck(t *testing.T) {
	nd := newNode(t)
	src := func(text string) UnitSource {
		return func(context.Context) (UnitSettings, bool, string, error) {
			u, err := ParseUnitSettings("pve-inspectd.service", strings.NewReader(text))
			return u, true, "", err
		}
	}
	var local []StorageInfo
	if err := nd.px.Get(context.Background(), "/storage", &local); err != nil {
		t.Fatal(err)
	}
	path := ""
	for _, s := range local {
		if s.Storage == "local" {
			path = s.Path
		}
	}
	if path == "" {
		t.Fatalf("no path for local in %+v", local)
	}
	images := filepath.Join(path, "images")
	want(t, run(t, UnitCheck(nd.px, nd.n, src("[Service]\nProtectSystem=strict\nReadWritePaths=/run\n"))), Fail,
		"makes "+images+" read-only", "ReadWritePaths="+images)
	want(t, run(t, UnitCheck(nd.px, nd.n, src("[Service]\nProtectSystem=strict\nReadWritePaths="+path+"\n"))), Pass, images+" writable", "")

	notUnder := func(context.Context) (UnitSettings, bool, string, error) {
		return UnitSettings{}, false, "the daemon does not run under systemd here", nil
	}
	want(t, run(t, UnitCheck(nd.px, nd.n, notUnder)), Skip, "does not run under systemd", "")
	nd.n.TransferStorage = ""
	want(t, run(t, UnitCheck(nd.px, nd.n, src("[Service]\nProtectSystem=strict\n"))), Skip, "disk_transfer_storage is off", "")
}

// TestSystemdUnit reads the shipped unit's effective settings from real
// systemd (a container booting the packaged unit file, plus a drop-in an
// operator adds) through `systemctl show`: the drop-in's ReadWritePaths
// reach the check, the unit's PrivateDevices=yes blocks a block storage,
// and a unit systemd does not know is reported as not running under it.
func TestSystemdUnit(t *testing.T) {
	testkit.RequireRoot(t, "debootstrap", "nsenter")
	shipped, err := os.ReadFile(filepath.Join("..", "packaging", "deb", "pve-inspectd.service"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := sysbox.Start(ctx, sysbox.Options{Name: "doctor-unit", Units: map[string]string{"pve-inspectd.service": string(shipped)},
		Files: []sysbox.File{{Path: "/etc/systemd/system/pve-inspectd.service.d/transfer.conf",
			Data: []byte("[Service]\nReadWritePaths=/srv/vz/images\n")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close container: %v", err)
		}
	})
	run := func(ctx context.Context, argv ...string) ([]byte, error) { return c.Exec(ctx, argv...) }
	u, ok, why, err := SystemdUnit(run, "pve-inspectd.service", "")(ctx)
	if err != nil || !ok {
		t.Fatalf("systemctl show: ok %v, %q, %v", ok, why, err)
	}
	if !strings.HasPrefix(u.Source, "systemctl show") {
		t.Errorf("source %q", u.Source)
	}
	for _, tc := range []struct {
		path string
		ok   bool
		why  string
	}{
		{"/srv/vz/images", true, "ReadWritePaths=/srv/vz/images"},
		{"/var/lib/vz/images", true, "ReadWritePaths=/var/lib/vz/images"},
		{"/var/lib/vz/dump", false, "ProtectSystem=strict"},
		{"/srv/other/images", false, "ProtectSystem=strict"},
		{"/run/vz/images", true, "ReadWritePaths=/run"},
		{"/home/vz/images", false, "ProtectHome=yes"},
	} {
		if ok, why, _ := u.WritablePath(tc.path); ok != tc.ok || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %v %q, want %v %q", tc.path, ok, why, tc.ok, tc.why)
		}
	}
	if ok, why, _ := u.BlockDevices(); ok || !strings.Contains(why, "PrivateDevices=yes") {
		t.Errorf("block devices under the shipped unit: %v %q", ok, why)
	}
	if _, ok, why, err := SystemdUnit(run, "no-such-unit.service", "")(ctx); ok || err != nil || !strings.Contains(why, "not loaded") {
		t.Errorf("unknown unit: ok %v, %q, %v", ok, why, err)
	}
}

// FuzzParseUnitSettings: any unit text parses without panic, and the
// verdicts on it are consistent (a refusal always says what to change).
func FuzzParseUnitSettings(f *testing.F) {
	f.Add("[Service]\nProtectSystem=strict\nReadWritePaths=/run -/var/lib/vz/images\n", "/var/lib/vz/images")
	f.Add("ProtectSystem=strict\nReadOnlyPaths=/var\nBindPaths=/a:/var/lib:rbind\nInaccessiblePaths=-/x\n", "/var/lib/vz")
	f.Add("[Service]\nPrivateDevices=yes\nDevicePolicy=closed\nDeviceAllow=\nDeviceAllow=/dev/dm-0 rwm\n", "/tmp/x")
	f.Fuzz(func(t *testing.T, text, p string) {
		u, err := ParseUnitSettings("fuzz", strings.NewReader(text))
		if err != nil {
			return
		}
		if !strings.HasPrefix(p, "/") {
			p = "/" + p
		}
		if ok, why, fix := u.WritablePath(p); !ok && (why == "" || fix == "") {
			t.Errorf("WritablePath(%q) refused without why/fix: %q %q", p, why, fix)
		}
		if ok, why, fix := u.BlockDevices(); !ok && (why == "" || fix == "") {
			t.Errorf("BlockDevices refused without why/fix: %q %q", why, fix)
		}
	})
}

// TestShippedUnit reads packaging/deb/pve-inspectd.service as
// --unit-file does: the default transfer storage's images directory
// (local, /var/lib/vz/images) is writable, another dir storage's is not,
// and a block storage's devices are hidden, each refusal naming the
// package's example drop-in.
func TestShippedUnit(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "packaging", "deb", "pve-inspectd.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u, err := ParseUnitSettings("pve-inspectd.service", f)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why, fix := u.WritablePath("/var/lib/vz/images"); !ok {
		t.Errorf("the shipped unit hides the default transfer storage's images: %s; %s", why, fix)
	}
	if ok, _, fix := u.WritablePath("/srv/pve-dir/images"); ok || !strings.Contains(fix, "transfer-storage.conf") {
		t.Errorf("another dir storage under the shipped unit: %v, fix %q", ok, fix)
	}
	if ok, _, fix := u.BlockDevices(); ok || !strings.Contains(fix, "transfer-storage.conf") {
		t.Errorf("block devices under the shipped unit: %v, fix %q", ok, fix)
	}
}
