// Package libvirtdtest starts a libvirtd for a test: in its own mount and
// network namespaces, with its config, state, run, log and cache
// directories bind-mounted from the test's temporary directory, so it shares
// nothing with a libvirtd of the host and the NAT networks it makes route
// nowhere but that namespace. The test's cleanup removes every domain,
// network, pool and volume, stops the daemon by its pid and then any process
// it left in its namespace.
package libvirtdtest

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Tools are the programs Start runs; a test calls
// testkit.RequireRoot(t, libvirtdtest.Tools()...) before Start. Debian:
// libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
// qemu-system-x86 qemu-utils dnsmasq-base iproute2 util-linux (make deps
// installs them).
func Tools() []string {
	return []string{"libvirtd", "virsh", "unshare", "ip", "qemu-system-x86_64", "qemu-img", "dnsmasq"}
}

// Daemon is a libvirtd a test started.
type Daemon struct {
	// Dir is the daemon's private tree; Dir/serial exists for serial logs.
	Dir string
	// URI connects to it (qemu:///system with its own socket).
	URI    string
	socket string
	cmd    *exec.Cmd
	exited chan error
	netns  string
	logBuf *lockedBuffer
	// pid is the running daemon's pid (0 when none), for the watchdog.
	pid   atomic.Int64
	watch *time.Timer
}

// watchdogAfter bounds a test's use of its daemon: a test still running
// this long after Start has a call that hangs (libvirt's RPCs have no
// deadline), and the watchdog kills the daemon so that the call returns an
// error and the test fails with the daemon's log instead of running into
// go test's timeout.
const watchdogAfter = 20 * time.Minute

// lockedBuffer is the daemon's output, written by exec's copier and read
// by the clean-up and the watchdog.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Bytes is a copy of what was written.
func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

const daemonScript = `set -e
T="$1"
mount --make-rprivate /
mount -t tmpfs tmpfs /run
mkdir -p /run/libvirt
mount --bind "$T/run" /run/libvirt
mount --bind "$T/etc" /etc/libvirt
mount --bind "$T/lib" /var/lib/libvirt
mount --bind "$T/log" /var/log/libvirt
mount --bind "$T/cache" /var/cache/libvirt
mount -t sysfs sysfs /sys
ip link set lo up
exec libvirtd
`

// Start starts a libvirtd and registers its clean-up. The test must be
// root (testkit.RequireRoot(t, Tools()...) skips or fails it first).
func Start(t testing.TB) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("libvirtdtest.Start needs root: call testkit.RequireRoot(t, libvirtdtest.Tools()...) first")
	}
	for _, d := range []string{"/etc/libvirt", "/var/lib/libvirt", "/var/log/libvirt", "/var/cache/libvirt"} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s: %v (libvirt-daemon-system installs it)", d, err)
		}
	}
	dir := t.TempDir()
	for _, d := range []string{"etc/qemu/networks", "etc/storage", "run", "lib/qemu", "lib/dnsmasq", "log/qemu", "cache/qemu", "serial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/libvirtd.conf": "auth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\nunix_sock_rw_perms = \"0700\"\nunix_sock_ro_perms = \"0700\"\nlog_outputs = \"3:stderr\"\n",
		// The daemon's QEMU runs as root without a security driver: the
		// volumes sit in the test's private temporary directory.
		"etc/qemu.conf": "user = \"root\"\ngroup = \"root\"\nsecurity_driver = \"none\"\ndynamic_ownership = 0\nremember_owner = 0\nstdio_handler = \"file\"\ncgroup_controllers = [ ]\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := &Daemon{Dir: dir, socket: filepath.Join(dir, "run", "libvirt-sock"), logBuf: &lockedBuffer{}}
	d.URI = "qemu:///system?socket=" + url.QueryEscape(d.socket)
	t.Cleanup(func() { d.stop(t) })
	d.launch(t)
	d.watch = time.AfterFunc(watchdogAfter, d.bite)
	return d
}

// launch starts libvirtd in fresh namespaces and waits for its socket.
func (d *Daemon) launch(t testing.TB) {
	t.Helper()
	d.cmd = exec.Command("sh", "-c", daemonScript, "sh", d.Dir)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET}
	d.cmd.Stdout, d.cmd.Stderr = d.logBuf, d.logBuf
	// A process libvirtd started that kept its output open must not hold
	// Wait (and with it halt) once libvirtd itself is gone.
	d.cmd.WaitDelay = 10 * time.Second
	if err := d.cmd.Start(); err != nil {
		d.cmd = nil
		t.Fatal(err)
	}
	d.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(d.cmd, d.exited)
	d.netns, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/net", d.cmd.Process.Pid))
	d.pid.Store(int64(d.cmd.Process.Pid)) // after netns: the watchdog reads both
	for i := 0; ; i++ {
		if _, err := os.Stat(d.socket); err == nil {
			return
		}
		select {
		case err := <-d.exited:
			d.exited <- err
			t.Fatalf("libvirtd exited: %v\n%s", err, d.logBuf.Bytes())
		case <-time.After(200 * time.Millisecond):
		}
		if i > 600 {
			t.Fatalf("libvirtd made no socket\n%s", d.logBuf.Bytes())
		}
	}
}

// Reboot is a host reboot as libvirt sees it: running domains are powered
// off, the daemon stops, its namespace (bridges, dnsmasq) goes away, /run
// is empty again, and a new daemon starts on the same configuration and
// disks; it starts what is marked autostart.
func (d *Daemon) Reboot(t testing.TB) {
	t.Helper()
	c, err := d.Connect()
	if err != nil {
		t.Fatal(err)
	}
	doms, _, _ := c.ConnectListAllDomains(1, 0)
	for _, dom := range doms {
		c.DomainDestroy(dom)
	}
	c.Disconnect()
	d.halt(t)
	ents, _ := os.ReadDir(filepath.Join(d.Dir, "run"))
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(d.Dir, "run", e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	d.launch(t)
}

// stop removes every domain, network and pool the daemon holds and halts
// it.
func (d *Daemon) stop(t testing.TB) {
	if d.watch != nil {
		d.watch.Stop()
	}
	if c, err := d.Connect(); err == nil {
		doms, _, _ := c.ConnectListAllDomains(1, 0)
		for _, dom := range doms {
			c.DomainDestroy(dom)
			c.DomainUndefine(dom)
		}
		nets, _, _ := c.ConnectListAllNetworks(1, 0)
		for _, n := range nets {
			c.NetworkDestroy(n)
			c.NetworkUndefine(n)
		}
		pools, _, _ := c.ConnectListAllStoragePools(1, 0)
		for _, p := range pools {
			vols, _, _ := c.StoragePoolListAllVolumes(p, 1, 0)
			for _, v := range vols {
				c.StorageVolDelete(v, 0)
			}
			c.StoragePoolDestroy(p)
			c.StoragePoolDelete(p, 0)
			c.StoragePoolUndefine(p)
		}
		c.Disconnect()
	}
	d.halt(t)
	if t.Failed() {
		t.Logf("libvirtd log:\n%s", Tail(d.logBuf.Bytes()))
	}
}

// bite is the watchdog: it kills the daemon and what it left in its
// network namespace, so that every call in flight fails.
func (d *Daemon) bite() {
	pid := int(d.pid.Load())
	if pid == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "libvirtdtest: watchdog: the test still uses libvirtd %s after %v; killing it (pid %d) so that hung calls fail; its log ends:\n%s\n",
		d.Dir, watchdogAfter, pid, Tail(d.logBuf.Bytes()))
	_ = syscall.Kill(pid, syscall.SIGKILL)
	d.killLeftovers(func(string, ...any) {})
}

// halt stops the daemon by its pid, then any process it left in its
// network namespace (dnsmasq, QEMU), found through the pid files under its
// own run directory.
func (d *Daemon) halt(t testing.TB) {
	if d.cmd == nil {
		return
	}
	d.pid.Store(0)
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		select {
		case <-d.exited:
		case <-time.After(time.Minute):
			t.Errorf("libvirtd (pid %d) not reaped a minute after SIGKILL", d.cmd.Process.Pid)
		}
	}
	d.cmd = nil
	d.killLeftovers(t.Logf)
}

// killLeftovers kills the processes libvirtd left in its network
// namespace (dnsmasq, QEMU), found through the pid files under its own run
// directory.
func (d *Daemon) killLeftovers(logf func(string, ...any)) {
	pids, _ := filepath.Glob(filepath.Join(d.Dir, "run", "*", "*.pid"))
	for _, p := range pids {
		b, _ := os.ReadFile(p)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			continue
		}
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); ns != "" && ns == d.netns {
			logf("stopping pid %d left by libvirtd (%s)", pid, p)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Connect opens a client connection to the daemon.
func (d *Daemon) Connect() (*libvirt.Libvirt, error) {
	u, _ := url.Parse(d.URI)
	return libvirt.ConnectToURI(u)
}

// Virsh runs virsh against the daemon and fails the test on error.
func (d *Daemon) Virsh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("virsh", append([]string{"-c", d.URI}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("virsh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Inventory is what the daemon holds: domains, networks with their DHCP
// host entries, pools and volumes, by name.
func (d *Daemon) Inventory(t testing.TB) string {
	t.Helper()
	c, err := d.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect()
	var b strings.Builder
	doms, _, err := c.ConnectListAllDomains(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range doms {
		fmt.Fprintf(&b, "domain %s\n", x.Name)
	}
	nets, _, _ := c.ConnectListAllNetworks(1, 0)
	for _, n := range nets {
		fmt.Fprintf(&b, "network %s\n", n.Name)
		var nx libvirtxml.Network
		if x, err := c.NetworkGetXMLDesc(n, 0); err == nil && nx.Unmarshal(x) == nil {
			for _, ip := range nx.IPs {
				if ip.DHCP != nil {
					for _, h := range ip.DHCP.Hosts {
						fmt.Fprintf(&b, "  host %s %s\n", h.Name, h.IP)
					}
				}
			}
		}
	}
	pools, _, _ := c.ConnectListAllStoragePools(1, 0)
	for _, p := range pools {
		fmt.Fprintf(&b, "pool %s\n", p.Name)
		vols, _, _ := c.StoragePoolListAllVolumes(p, 1, 0)
		for _, v := range vols {
			fmt.Fprintf(&b, "  volume %s\n", v.Name)
		}
	}
	return b.String()
}

// WaitFor polls f until it reports true, failing the test with f's last
// words when ctx ends.
func WaitFor(ctx context.Context, t testing.TB, what string, f func() (bool, string)) {
	t.Helper()
	var last string
	for {
		ok, s := f()
		if ok {
			return
		}
		last = s
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not before the test's bound; last:\n%s", what, Tail([]byte(last)))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Tail is the last 4000 bytes of b.
func Tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
