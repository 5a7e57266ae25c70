// Command testinit is PID 1 of the tiny guest the libvirt lifecycle test
// boots (cloud/kvm libvirt_test.go). It loads the virtio modules shipped in
// its initramfs, finds the NoCloud seed on the virtio disks, prints a marker
// with the seed's digest on the serial console (which the test reads from
// the domain's serial log), brings up the NIC and answers on the TCP ports
// named by pvetest.ports= on the kernel command line. It never exits (PID 1
// must not).
package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/cloud/kvm/internal/seedcheck"
)

func say(format string, a ...any) {
	msg := fmt.Sprintf("testinit: "+format+"\n", a...)
	os.Stdout.WriteString(msg)
	if c, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		c.WriteString(msg)
		c.Close()
	}
}

func main() {
	for _, m := range []struct{ src, dst, typ string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, ""); err != nil {
			say("mount %s: %v", m.dst, err)
		}
	}
	loadModules()
	result := findSeed()
	say("%s", result)
	ports := cmdlinePorts()
	if err := netUp(); err != nil {
		say("NET-FAIL %v", err)
	}
	for _, p := range ports {
		go serve(p, result)
	}
	say("READY ports=%s", strings.Join(ports, ","))
	for {
		time.Sleep(time.Hour)
	}
}

// loadModules loads /modules/*.ko in the order of /modules/order.
func loadModules() {
	b, err := os.ReadFile("/modules/order")
	if err != nil {
		return
	}
	for _, name := range strings.Fields(string(b)) {
		img, err := os.ReadFile(filepath.Join("/modules", name))
		if err != nil {
			say("module %s: %v", name, err)
			continue
		}
		if err := unix.InitModule(img, ""); err != nil && err != unix.EEXIST {
			say("module %s: %v", name, err)
		}
	}
}

func findSeed() string {
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		devs, _ := filepath.Glob("/sys/block/vd*")
		for _, d := range devs {
			dev := "/dev/" + filepath.Base(d)
			s, err := seedcheck.Read(dev)
			if err == nil && strings.Contains(s, "label=cidata") {
				return "SEED-OK dev=" + dev + " " + s
			}
			if err != nil {
				last = err.Error()
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return "SEED-FAIL " + last
}

func cmdlinePorts() []string {
	b, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, "pvetest.ports="); ok {
			return strings.Split(v, ",")
		}
	}
	return nil
}

func netUp() error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		netlink.LinkSetUp(lo)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attrs().Name == "lo" || l.Type() != "device" {
				continue
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			addr, _ := netlink.ParseAddr("10.0.2.15/24")
			if err := netlink.AddrAdd(l, addr); err != nil {
				return err
			}
			say("NET-UP %s 10.0.2.15/24", l.Attrs().Name)
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("no network device")
}

func serve(port, result string) {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		say("listen %s: %v", port, err)
		return
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			continue
		}
		fmt.Fprintf(c, "PORT %s %s\n", port, result)
		c.Close()
	}
}
