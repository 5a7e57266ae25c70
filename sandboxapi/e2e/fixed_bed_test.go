package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestBedFixedAddress is issue 37's static addresses on the bed: a VM
// asking an address outside the DHCP range (.5) and one asking the range's
// first (.10, which the third VM's NIC would otherwise get) have them, in
// the API's addresses and in the guest (the zone's dnsmasq hands each its
// address by its MAC, as Proxmox's IPAM DHCP mapping makes it); the third
// VM has another and resolves the first by name to its fixed address; the
// delete leaves no IPAM entry.
func TestBedFixedAddress(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.79.0.0/24"}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "10.79.0.5"}}},
			{Name: "db", Template: "debian", NICs: []apitype.NIC{{Network: "lan", MAC: "52:54:00:12:34:56", IPv4: "10.79.0.10"}}},
			{Name: "cli", Template: "debian", Networks: []string{"lan"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
	run := func(vm, script string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			t.Errorf("%s: %q: exit %d: %s", vm, script, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	for i, want := range []string{"10.79.0.5", "10.79.0.10", ""} {
		v := sb.VMs[i]
		if len(v.Addresses) != 1 || (want != "" && v.Addresses[0].IPv4 != want) || (want == "" && (v.Addresses[0].IPv4 == "10.79.0.5" || v.Addresses[0].IPv4 == "10.79.0.10")) {
			t.Errorf("%s: addresses %+v, want %q", v.Name, v.Addresses, want)
			continue
		}
		got := v.Addresses[0].IPv4
		if out := run(v.Name, "ip -4 -o addr show dev eth0"); !strings.Contains(out, " "+got+"/24 ") {
			t.Errorf("%s: eth0 %q, want %s", v.Name, out, got)
		}
	}
	if out := run("db", "cat /sys/class/net/eth0/address"); out != "52:54:00:12:34:56" {
		t.Errorf("db's MAC %q", out)
	}
	if out := run("cli", "getent hosts web"); strings.Join(strings.Fields(out), " ") != "10.79.0.5 web" {
		t.Errorf("getent hosts web in cli: %q", out)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
		t.Errorf("IPAM entries left: %q", got)
	}
}
