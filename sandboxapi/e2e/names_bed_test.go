package e2e_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestBedNamesResolve is issue 37's names acceptance on the bed, with the
// host guard and egress policies as the daemon runs them: in a two-VM
// sandbox of each egress mode (open, allowlist, none) the API reports
// each VM's address from Proxmox's IPAM, which is the address the guest
// got; `getent hosts target` in attacker answers target's address,
// through /etc/hosts, without DNS; `hostname` prints each VM's name. The
// same names resolve by DNS, asked of the zone's gateway with a raw UDP
// query that no /etc/hosts can answer (the daemon's resolver, every mode):
// each sibling and the guest itself at the same address, authoritative,
// in any case and with the trailing dot, bare and under the zone's
// domain. The three sandboxes use the same
// names, and each resolves its own; a VM name of a fourth sandbox
// ("secret") never answers with its address in them, asked at their own
// gateway or at the fourth's. Two warm
// pool members claimed under a new name answer to it, although their
// /etc/hosts was a symlink, to another file in one, to a directory in the
// other (what it pointed to is left alone).
func TestBedNamesResolve(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	eg := &registryEgress{}
	hook := &guardHook{}
	e := newBedEnv(t, ctx, func(o *options) {
		o.Egress = eg
		o.WarmPool = []sandbox.PoolShape{{Name: "one", Template: "debian", Target: 2}}
		o.ZonesChanged = hook.zonesChanged
	})
	g := startCheckedGuard(t, ctx, e, bedChecker(t), hook)
	eg.start(t, ctx, e, g)

	run := func(sb, vm, script string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb, vm, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			t.Errorf("%s/%s: %q: exit %d: %s", sb, vm, script, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	// dnsA asks server for name (A) over UDP from the guest: "aa=<0|1>
	// rcode=<n> <addresses>", or the error python printed
	dnsA := func(sb, vm, server, name string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb, vm, apitype.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", dnsQueryPy, name, server}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			return "error: " + strings.TrimSpace(string(res.Stderr))
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	addr := func(v apitype.VM) string {
		t.Helper()
		if len(v.Addresses) != 1 || v.Addresses[0].Network != "net0" {
			t.Fatalf("vm %s: addresses %+v, want one on net0", v.Name, v.Addresses)
		}
		return v.Addresses[0].IPv4
	}
	other, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "secret", Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), other.ID) })
	secret := addr(other.VMs[0])
	if out := dnsA(other.ID, "secret", other.Networks[0].Gateway, "secret"); out != "aa=1 rcode=0 "+secret {
		t.Errorf("secret asks its own name by DNS: %q, want %s (the positive control)", out, secret)
	}
	for _, pol := range []*apitype.EgressPolicy{nil, {Mode: "allowlist", Allow: []string{testvm.InternetAddr + "/32"}}, {Mode: "none"}} {
		mode := "open"
		if pol != nil {
			mode = pol.Mode
		}
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "attacker", Template: "debian"}, {Name: "target", Template: "debian"}}, Egress: pol})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
		got, err := e.c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		att, tgt := addr(got.VMs[0]), addr(got.VMs[1])
		if att == tgt {
			t.Fatalf("%s: both VMs at %s", mode, att)
		}
		if out := run(sb.ID, "attacker", "getent hosts target"); strings.Join(strings.Fields(out), " ") != tgt+" target" {
			t.Errorf("egress %s: getent hosts target in attacker: %q, want %s (the API's)", mode, out, tgt)
		}
		if out := run(sb.ID, "target", "getent hosts attacker"); strings.Join(strings.Fields(out), " ") != att+" attacker" {
			t.Errorf("egress %s: getent hosts attacker in target: %q, want %s", mode, out, att)
		}
		// by DNS, from both guests, to the zone's gateway
		gw := got.Networks[0].Gateway
		for _, asker := range []string{"attacker", "target"} {
			for name, want := range map[string]string{"target": tgt, "TARGET.": tgt, "attacker": att, "Attacker.": att,
				"target." + bedZoneDomain(got.Zone): tgt, "other." + bedZoneDomain(got.Zone): ""} {
				if want == "" {
					// not a VM: the path of any name under the domain
					if out := dnsA(sb.ID, asker, gw, name); strings.HasPrefix(out, "aa=1 rcode=0") {
						t.Errorf("egress %s: %s asks %s (no VM) by DNS: %q", mode, asker, name, out)
					}
					continue
				}
				if out := dnsA(sb.ID, asker, gw, name); out != "aa=1 rcode=0 "+want {
					t.Errorf("egress %s: %s asks %s by DNS: %q, want %s (its /etc/hosts line)", mode, asker, name, out, want)
				}
			}
			// NXDOMAIN as any unknown name (open: the zone's dnsmasq's),
			// bare or under either sandbox's domain
			for _, n := range []string{"secret", "secret." + bedZoneDomain(got.Zone), "secret." + bedZoneDomain(other.Zone)} {
				if out := dnsA(sb.ID, asker, gw, n); strings.Contains(out, secret) || !strings.HasSuffix(out, "rcode=3") {
					t.Errorf("egress %s: %s asks another sandbox's VM %s by DNS: %q, want NXDOMAIN", mode, asker, n, out)
				}
			}
			// asked at the other sandbox's own gateway: never its address
			// (the names are the asking interface's sandbox's): NXDOMAIN
			// where the guard redirects every DNS question (allowlist,
			// none), no answer at all in open mode (not redirected, not
			// let in)
			if out := dnsA(sb.ID, asker, other.Networks[0].Gateway, "secret"); strings.Contains(out, secret) ||
				!strings.HasSuffix(out, "rcode=3") && !strings.HasSuffix(out, "TimeoutError: timed out") {
				t.Errorf("egress %s: %s asks secret at the other sandbox's gateway: %q, want NXDOMAIN or no answer", mode, asker, out)
			}
		}
		for _, v := range got.VMs {
			if out := run(sb.ID, v.Name, "hostname; cat /etc/hostname"); out != v.Name+"\n"+v.Name {
				t.Errorf("egress %s: hostname and /etc/hostname of %s: %q", mode, v.Name, out)
			}
		}
		// the IPAM's address is the one the guest got from the zone's DHCP
		if out := run(sb.ID, "target", "ip -4 -o addr show dev eth0"); !strings.Contains(out, " "+tgt+"/") {
			t.Errorf("egress %s: target's eth0 %q lacks the API's address %s", mode, out, tgt)
		}
	}

	// The pool members: each one's /etc/hosts made a symlink before the
	// claim (directly through its agent: no API call reaches a member),
	// one to another file, one to a directory.
	e.srv.Engine().MaintainPool(ctx)
	members := e.srv.Engine().Pool().Members
	if len(members) != 2 || len(members[0].VMIDs) != 1 || len(members[1].VMIDs) != 1 {
		t.Fatalf("pool members %+v", members)
	}
	const victim = "192.0.2.99 web\n"
	plants := map[int]string{
		members[0].VMIDs[0]: "printf '" + victim + "' > /root/victim && ln -sf /root/victim /etc/hosts",
		members[1].VMIDs[0]: "mkdir /root/victim.d && printf '" + victim + "' > /root/victim.d/x && ln -sf /root/victim.d /etc/hosts",
	}
	for vmid, plant := range plants {
		guest := qga.New(qga.Options{}).SandboxGuests()(filepath.Join(e.bed.QGADir(), strconv.Itoa(vmid)+".qga"))
		res, err := guest.Exec(ctx, sandbox.GuestExec{Argv: []string{"/bin/sh", "-c", plant}, Timeout: 10})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("plant the symlink in %d: %+v %v", vmid, res, err)
		}
	}
	for range plants {
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "web", Template: "debian"}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
		if _, ok := plants[sb.VMs[0].VMID]; !sb.FromPool || !ok {
			t.Fatalf("create not claimed from the pool: %+v", sb)
		}
		web := addr(sb.VMs[0])
		if out := run(sb.ID, "web", "hostname"); out != "web" {
			t.Errorf("claimed VM %d's hostname %q, want web (not the member's)", sb.VMs[0].VMID, out)
		}
		if out := run(sb.ID, "web", "getent hosts web"); strings.Join(strings.Fields(out), " ") != web+" web" {
			t.Errorf("claimed VM %d: getent hosts web %q, want %s", sb.VMs[0].VMID, out, web)
		}
		if out := run(sb.ID, "web", "if [ -L /etc/hosts ]; then echo link; fi; cat /root/victim /root/victim.d/x 2>/dev/null; true"); out != strings.TrimSpace(victim) {
			t.Errorf("claimed VM %d after the claim: %q, want /etc/hosts a file of its own and the symlink's target untouched", sb.VMs[0].VMID, out)
		}
	}
}

// dnsQueryPy asks argv[2] (port 53, UDP) for the A records of argv[1]
// with a query of its own (no resolver library, no /etc/hosts) and
// prints "aa=<0|1> rcode=<n>" and the answer's addresses.
const dnsQueryPy = `import socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
qname = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l) + b"\0"
q = struct.pack(">HHHHHH", 0x3725, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, (server, 53))
while True:
    r = s.recv(4096)
    if r[:2] == q[:2]:
        break
flags, qd, an = struct.unpack(">HHH", r[2:8])
def skip(i):
    while True:
        b = r[i]
        if b == 0:
            return i + 1
        if b >= 192:
            return i + 2
        i += b + 1
i = 12
for _ in range(qd):
    i = skip(i) + 4
out = []
for _ in range(an):
    i = skip(i)
    t, c, ttl, l = struct.unpack(">HHIH", r[i:i + 10])
    i += 10
    if t == 1:
        out.append(socket.inet_ntoa(r[i:i + 4]))
    i += l
print(("aa=%d rcode=%d " % ((flags >> 10) & 1, flags & 15)) + " ".join(out))
`
