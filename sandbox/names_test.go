package sandbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// hostsLines is the managed block of a guest's /etc/hosts, one "ip name"
// per line (tabs as spaces), without its markers.
func hostsLines(t *testing.T, b *poolBed, vmid int) []string {
	t.Helper()
	f, ok := b.g.File(vmid, "/etc/hosts")
	if !ok {
		t.Fatalf("vm %d has no /etc/hosts", vmid)
	}
	var out []string
	in := false
	for _, l := range strings.Split(string(f), "\n") {
		switch {
		case strings.HasPrefix(l, "# BEGIN pve-inspect"):
			in = true
		case strings.HasPrefix(l, "# END pve-inspect"):
			in = false
		case in:
			out = append(out, strings.ReplaceAll(l, "\t", " "))
		}
	}
	return out
}

// wantLines is the block a sandbox's VMs should have: every VM's name at
// the address the API reports.
func wantLines(sb apitype.Sandbox) string {
	var w []string
	for _, v := range sb.VMs {
		w = append(w, v.Addresses[0].IPv4+" "+v.Name)
	}
	return strings.Join(w, ",")
}

// TestNamesInGuests: a sandbox's VMs report their IPAM addresses, each
// guest's hostname is its VM's name and its /etc/hosts names every VM of
// its own sandbox (the guest's other lines kept), and nothing of a second
// sandbox; a claimed pool member is renamed to the request's name.
func TestNamesInGuests(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, nil)
	two := func() apitype.CreateRequest {
		r := oneVM("debian")
		r.VMs = append(r.VMs, r.VMs[0])
		r.VMs[0].Name, r.VMs[1].Name = "attacker", "target"
		return r
	}
	a, err := b.e.Create(ctx, two())
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.e.Create(ctx, two())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []apitype.Sandbox{a, c} {
		for _, v := range sb.VMs {
			if len(v.Addresses) != 1 || v.Addresses[0].Network != "net0" {
				t.Fatalf("%s/%s addresses %+v, want one on net0", sb.ID, v.Name, v.Addresses)
			}
			if got := b.g.Hostname(v.VMID); got != v.Name {
				t.Errorf("%s/%s hostname %q", sb.ID, v.Name, got)
			}
			if got, _ := b.g.File(v.VMID, "/etc/hostname"); string(got) != v.Name+"\n" {
				t.Errorf("%s/%s /etc/hostname %q", sb.ID, v.Name, got)
			}
			if got := strings.Join(hostsLines(t, b, v.VMID), ","); got != wantLines(sb) {
				t.Errorf("%s/%s hosts block %q, want exactly its own sandbox's %q", sb.ID, v.Name, got, wantLines(sb))
			}
			if f, _ := b.g.File(v.VMID, "/etc/hosts"); !strings.HasSuffix(string(f), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n") {
				t.Errorf("%s/%s /etc/hosts lost its localhost lines: %q", sb.ID, v.Name, f)
			}
		}
	}
	if a.VMs[0].Addresses[0] == c.VMs[0].Addresses[0] && a.Networks[0].CIDR == c.Networks[0].CIDR {
		t.Errorf("two sandboxes report the same address %v", a.VMs[0].Addresses)
	}
	got, _ := b.e.Get(a.ID)
	if got.VMs[1].Addresses[0] != a.VMs[1].Addresses[0] {
		t.Errorf("get reports %+v, create %+v", got.VMs[1].Addresses, a.VMs[1].Addresses)
	}

	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 1 {
		t.Fatalf("members %+v", members)
	}
	req := oneVMSized("debian", 1, 512)
	req.VMs[0].Name = "web"
	sb, err := b.e.Create(ctx, req)
	if err != nil || !sb.FromPool {
		t.Fatalf("claim: %+v %v", sb, err)
	}
	v := sb.VMs[0]
	if b.g.Hostname(v.VMID) != "web" || strings.Join(hostsLines(t, b, v.VMID), ",") != wantLines(sb) {
		t.Errorf("claimed VM: hostname %q, hosts %q: want web and %q", b.g.Hostname(v.VMID), hostsLines(t, b, v.VMID), wantLines(sb))
	}

	// a restart keeps the addresses (the state file)
	b.e = b.restart(t)
	if got, _ := b.e.Get(a.ID); got.VMs[1].Addresses[0] != a.VMs[1].Addresses[0] {
		t.Errorf("after a restart: %+v, want %+v", got.VMs[1].Addresses, a.VMs[1].Addresses)
	}
}
