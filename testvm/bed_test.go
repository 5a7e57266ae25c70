package testvm

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TwoZones is the zone layout most tests use.
func twoZones() []Zone {
	return []Zone{
		{ID: "zonea", VNets: []VNet{{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
			DHCP: []DHCPRange{{Start: netip.MustParseAddr("10.10.1.100"), End: netip.MustParseAddr("10.10.1.200")}}, SNAT: true}}},
		{ID: "zoneb", VNets: []VNet{{Name: "vnetb", Subnet: netip.MustParsePrefix("10.10.2.0/24"), Gateway: netip.MustParseAddr("10.10.2.1"),
			DHCP: []DHCPRange{{Start: netip.MustParseAddr("10.10.2.100"), End: netip.MustParseAddr("10.10.2.200")}}, SNAT: true}}},
	}
}

// upTwoZones brings up a bed with twoZones and one guest in each (101 on
// vneta, 102 on vnetb); the bed is closed when the test ends.
func upTwoZones(t *testing.T) (*Bed, *Guest, *Guest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Up(ctx, Options{Logger: testkit.FailureLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, z := range twoZones() {
		if err := b.AddZone(ctx, z); err != nil {
			t.Fatal(err)
		}
	}
	ga, err := b.StartGuest(ctx, GuestSpec{VMID: 101, VNet: "vneta", MemoryMiB: 384, CPUs: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.StartGuest(ctx, GuestSpec{VMID: 102, VNet: "vnetb"})
	if err != nil {
		t.Fatal(err)
	}
	return b, ga, gb
}

func TestBedUpDown(t *testing.T) {
	testkit.RequireRoot(t)
	b, ga, gb := upTwoZones(t)
	if !netip.MustParsePrefix("10.10.1.0/24").Contains(ga.IPv4()) || !netip.MustParsePrefix("10.10.2.0/24").Contains(gb.IPv4()) {
		t.Fatalf("DHCP addresses: a=%v b=%v", ga.IPv4(), gb.IPv4())
	}
	out, err := exec.Command("ip", "netns", "exec", ga.NS, "ip", "-4", "route").CombinedOutput()
	t.Logf("guest a routes: %s (%v)", out, err)
	// A guest's root sets its own hostname, as a VM's does, and only its
	// own: the machine's and the other guest's stay.
	host, _ := os.Hostname()
	if out := rawExec(t, ga.Socket, "/bin/sh", "-c", "hostname; hostname attacker && hostname"); out != "vm101\nattacker\n" {
		t.Errorf("guest 101: hostname before and after setting it: %q", out)
	}
	if out := rawExec(t, gb.Socket, "/bin/hostname"); out != "vm102\n" {
		t.Errorf("guest 102's hostname: %q", out)
	}
	if now, _ := os.Hostname(); now != host {
		t.Errorf("the machine's hostname changed from %q to %q", host, now)
	}
	// Guest a's scope is capped as its VM would be: 384 MiB of RAM and
	// 1.5 CPUs of CPU time; guest b's has no cap.
	caps := map[string]string{}
	for _, d := range b.scopeDirs(101) {
		for _, f := range []string{"memory.max", "memory.limit_in_bytes", "cpu.max", "cpu.cfs_quota_us"} {
			if v, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				caps[f] = strings.TrimSpace(string(v))
			}
		}
	}
	mem, cpu := caps["memory.max"]+caps["memory.limit_in_bytes"], caps["cpu.max"]+caps["cpu.cfs_quota_us"]
	if mem != strconv.Itoa(384<<20) || (cpu != "150000 100000" && cpu != "150000") {
		t.Errorf("guest 101's scope caps: %v, want memory %d and cpu 1.5 CPUs", caps, 384<<20)
	}
	for _, d := range b.scopeDirs(102) {
		if v, err := os.ReadFile(filepath.Join(d, "cpu.cfs_quota_us")); err == nil && strings.TrimSpace(string(v)) != "-1" {
			t.Errorf("guest 102 has a CPU cap: %s", v)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ns, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	if strings.Contains(string(ns), b.Name()+"-") {
		t.Fatalf("namespaces left: %s", ns)
	}
}
