package e2e_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEmulatorFixedAddress: a VM asking a fixed address (the first of the
// DHCP range, which its sibling's NIC would otherwise take) and one asking
// a MAC, with the token pve-access-setup makes: the API reports the fixed
// address, the IPAM holds only it for the NIC's MAC (the range address the
// configure gave the NIC is gone), the start mapped it for the zone's DHCP,
// the sibling has another; the delete leaves no IPAM entry and nothing of
// the MACs in Proxmox's MAC cache.
func TestEmulatorFixedAddress(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.77.0.0/24"}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "10.77.0.10"}}},
			{Name: "db", Template: "debian", NICs: []apitype.NIC{{Network: "lan", MAC: "52:54:00:12:34:56"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	web, db := sb.VMs[0], sb.VMs[1]
	mac := web.NICs[0].MAC
	if !slices.Equal(web.Addresses, []apitype.VMAddress{{Network: "lan", IPv4: "10.77.0.10"}}) || mac == "" {
		t.Fatalf("web: addresses %+v NICs %+v, want the fixed address and the MAC the daemon picked", web.Addresses, web.NICs)
	}
	if len(db.Addresses) != 1 || db.Addresses[0].IPv4 == "10.77.0.10" || db.NICs[0].MAC != "52:54:00:12:34:56" {
		t.Fatalf("db: addresses %+v NICs %+v", db.Addresses, db.NICs)
	}
	var ofWeb []string
	for _, l := range e.emu.IPAMEntries(sb.ID) {
		if strings.HasSuffix(l, " "+mac) {
			ofWeb = append(ofWeb, l)
		}
	}
	if !slices.Equal(ofWeb, []string{"10.77.0.0/24 10.77.0.10 " + mac}) {
		t.Errorf("web's IPAM entries %q, want the fixed address alone", ofWeb)
	}
	started := strings.Join(e.fb.Calls(), "\n")
	for _, line := range []string{"mac=" + strings.ToLower(mac) + " ip=10.77.0.10", "mac=52:54:00:12:34:56 ip=" + db.Addresses[0].IPv4} {
		if !strings.Contains(started, line) {
			t.Errorf("no start mapped %q:\n%s", line, started)
		}
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
		t.Errorf("IPAM entries left: %q", got)
	}
	for _, l := range e.emu.MACCache() {
		if strings.HasPrefix(l, mac+" ") || strings.HasPrefix(l, "52:54:00:12:34:56 ") {
			t.Errorf("MAC cache entry left: %q", l)
		}
	}
}
