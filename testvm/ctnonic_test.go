package testvm

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// TestContainerWithoutNIC (review 51b): a container whose config has no
// netN (a member of no_network) gets no lxc.net line, and lxc then
// clones a network namespace of its own for it (src/lxc/start.c
// resolve_clone_flags: CLONE_NEWNET is skipped only when
// lxc_requests_empty_network, which is 0 for an empty list of netdevs):
// its init runs in neither the node's namespace nor the host's, with the
// loopback only, and the node has no veth of it.
func TestContainerWithoutNIC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, rootfs := ctBed(ctx, t)
	const vmid = 206
	ct, err := b.StartContainer(ctx, ContainerSpec{VMID: vmid, Hostname: "cell", Rootfs: rootfs, Disk: filepath.Join(t.TempDir(), "disk"), MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.StopContainer(context.WithoutCancel(ctx), vmid) }()
	if conf := lxcConfig(ContainerSpec{VMID: vmid}, lxcHost{}); strings.Contains(conf, "lxc.net") {
		t.Errorf("the config of a container without NIC has lxc.net lines:\n%s", conf)
	}
	inode := func(p string) string {
		t.Helper()
		l, err := os.Readlink(p)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctNS := inode("/proc/" + strconv.Itoa(ct.PID) + "/ns/net")
	nodeNS, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeNS.Close()
	ctHandle, err := netns.GetFromPid(ct.PID)
	if err != nil {
		t.Fatal(err)
	}
	defer ctHandle.Close()
	if ctHandle.Equal(nodeNS) {
		t.Errorf("the container's init shares the node's network namespace (%s)", ctNS)
	}
	if host := inode("/proc/self/ns/net"); ctNS == host {
		t.Errorf("the container's init shares the host's network namespace (%s)", host)
	}
	links, err := os.ReadDir("/proc/" + strconv.Itoa(ct.PID) + "/root/sys/class/net")
	var names []string
	for _, l := range links {
		names = append(names, l.Name())
	}
	if err != nil || strings.Join(names, " ") != "lo" {
		t.Errorf("the container's /sys/class/net: %v (%v), want lo only", names, err)
	}
	out, err := output(ctx, "nsenter", "--net=/proc/"+strconv.Itoa(ct.PID)+"/ns/net", "ip", "-o", "link")
	if err != nil || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), ": lo:") {
		t.Errorf("the container's links (%v):\n%s\nwant lo only", err, out)
	}
	if out, _ := output(ctx, "ip", "-n", b.NodeNS(), "-o", "link"); strings.Contains(string(out), "veth"+strconv.Itoa(vmid)+"i") {
		t.Errorf("the node has a veth of a container without NIC:\n%s", out)
	}
	if err := b.StopContainer(ctx, vmid); err != nil {
		t.Fatal(err)
	}
	assertContainerGone(t, b, ct, ct.PID)
}
