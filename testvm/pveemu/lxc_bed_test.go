package pveemu

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestCTLifecycleOnBed clones a CT template through the emulator wired to
// the real test bed, starts it: a real unprivileged LXC container whose
// init runs as uid 100000 on the host and whose own DHCP client gets the
// IPAM's address from the zone's dnsmasq on the vnet's bridge; snapshots
// it running and rolls it back (a file of its root as it was); stops it,
// starts it again, shuts it down (its init powers off), destroys it, and
// finds nothing left: no process, veth, cgroup, mount, lxc directory or
// volume.
func TestCTLifecycleOnBed(t *testing.T) {
	testkit.RequireRoot(t, "lxc-start", "lxc-info", "lxc-stop", "debootstrap")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bed, e := ctBedEnv(ctx, t, map[string]string{"net0": "name=eth0,bridge=vnet1,ip=dhcp"})
	s := e.s
	e.setupZone()
	e.ctClone("101", url.Values{"hostname": {"ct101"}})
	ct := "/nodes/pve/lxc/101"
	start := func() *testvm.Container {
		t.Helper()
		if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
			t.Fatalf("start: %s", st)
		}
		c, ok := bed.Container(101)
		if !ok {
			t.Fatal("the bed runs no container 101")
		}
		return c
	}
	c := start()
	st, _ := e.ok("GET", ct+"/status/current", nil).(map[string]any)
	if st["status"] != "running" || st["pid"] != float64(c.PID) {
		t.Errorf("status/current %v; the bed's init pid %d", st, c.PID)
	}
	if pid, err := bed.ContainerPID(ctx, 101); err != nil || pid != c.PID {
		t.Errorf("lxc-info -p: %d, %v", pid, err)
	}
	if uid := statusUID(t, c.PID); uid != "100000" {
		t.Errorf("the container's init runs as uid %s on the host, want 100000", uid)
	}
	mac := parseLXCNet(ctConfig(e, 101, nil)["net0"].(string))["hwaddr"]
	want := s.IPAMEntries("sbx1")
	if !netip.MustParsePrefix("10.10.1.0/24").Contains(c.IPv4()) || !strings.Contains(strings.Join(want, "\n"), " "+c.IPv4().String()+" "+strings.ToUpper(mac)) {
		t.Errorf("DHCP address %v, IPAM %v (MAC %s)", c.IPv4(), want, mac)
	}
	if out, err := exec.Command("ip", "-n", bed.NodeNS(), "-o", "link", "show", "veth101i0").CombinedOutput(); err != nil || !strings.Contains(string(out), "master vnet1") {
		t.Errorf("veth101i0 on the node: %s %v", out, err)
	}
	pids := []int{c.PID}
	// A snapshot of the running CT keeps its own layer; a rollback stops
	// it, puts the layer back, and the CT started again sees it.
	marker := func(pid int) string { return fmt.Sprintf("/proc/%d/root/root/marker", pid) }
	if err := os.WriteFile(marker(c.PID), []byte("snapshot"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := e.task("POST", ct+"/snapshot", url.Values{"snapname": {"s1"}}); st != "OK" {
		t.Fatalf("snapshot: %s", st)
	}
	if err := os.WriteFile(marker(c.PID), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := e.task("POST", ct+"/snapshot/s1/rollback", nil); st != "OK" {
		t.Fatalf("rollback: %s", st)
	}
	if _, ok := bed.Container(101); ok {
		t.Error("the rollback left the container running")
	}
	c = start()
	pids = append(pids, c.PID)
	if b, err := os.ReadFile(marker(c.PID)); err != nil || string(b) != "snapshot" {
		t.Errorf("the CT's file after the rollback: %q %v", b, err)
	}
	if st := e.task("POST", ct+"/status/stop", nil); st != "OK" {
		t.Fatalf("stop: %s", st)
	}
	c = start()
	pids = append(pids, c.PID)
	if st := e.task("POST", ct+"/status/shutdown", url.Values{"timeout": {"30"}}); st != "OK" {
		t.Fatalf("shutdown: %s", st)
	}
	if st, _ := e.ok("GET", ct+"/status/current", nil).(map[string]any); st["status"] != "stopped" {
		t.Errorf("after the shutdown: %v", st)
	}
	if st := e.task("DELETE", ct, nil); st != "OK" {
		t.Fatalf("destroy: %s", st)
	}
	for _, pid := range pids {
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(data), ") Z") {
			t.Errorf("the container's init %d is still there: %s", pid, data)
		}
	}
	if _, ok := bed.Container(101); ok {
		t.Error("the bed still runs container 101")
	}
	if out, _ := exec.Command("ip", "-n", bed.NodeNS(), "-o", "link").CombinedOutput(); strings.Contains(string(out), "veth101") {
		t.Errorf("veth left on the node: %s", out)
	}
	left, _ := filepath.Glob(filepath.Join(bed.CgroupRoot(), "*", bed.CgroupParent(), "lxc*", "101"))
	left2, _ := filepath.Glob(filepath.Join(bed.CgroupRoot(), bed.CgroupParent(), "lxc*", "101"))
	if len(left)+len(left2) > 0 {
		t.Errorf("cgroups left: %v %v", left, left2)
	}
	for _, d := range []string{filepath.Join(bed.LXCPath(), "101"), s.vmDir(101)} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left (%v)", d, err)
		}
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), bed.Dir()+"/lxc") {
		t.Errorf("a mount of the container is left in the host's namespace")
	}
	if v := s.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %v", v)
	}
}

// ctBedEnv is bedEnv with the CT template (ctTemplateID, config conf) on
// the bed's container root.
func ctBedEnv(ctx context.Context, t *testing.T, conf map[string]string) (*testvm.Bed, *env) {
	t.Helper()
	rootfs, err := testvm.CTRootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bed, e := bedEnv(ctx, t)
	if err := e.s.AddCTTemplate(ctTemplateID, "ct-tmpl", rootfs, conf); err != nil {
		t.Fatal(err)
	}
	return bed, e
}

// statusUID is the real uid of pid (/proc/<pid>/status).
func statusUID(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("no Uid line for %d", pid)
	return ""
}
