package egress

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestSharedSubnetOnBed: two bridges holding one IPv4 subnet (zonea's
// 10.10.1.0/24 on zoneb's vnet too, after zonea's: Proxmox allows one
// range in two zones) cannot be told apart by the source, and the
// guard's source check (egress-rpf-*) drops the second bridge's hosts; the
// node routed them no answer before it either: its one route for the
// subnet (the first bridge's; fib_table_lookup takes the first alias of
// a prefix) sends the answer out of zonea's vnet. A host of that subnet
// on zoneb's segment (its VXLAN uplink, underlayLeg) asks zoneb's address
// in the subnet: no answer, a drop counted, and the node's route back to
// it is zonea's vnet. zonea's own guest keeps its answers.
func TestSharedSubnetOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	underlayLeg(t, ctx, s)
	setRPFilter(t, ctx, s, 2)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	const second, host = "10.10.1.254", "10.10.1.77"
	run("ip", "-n", s.b.NodeNS(), "addr", "add", second+"/24", "dev", s.bridge["zoneb"])
	run("ip", "-n", s.guests["zonea"].NS, "addr", "add", host+"/32", "dev", "leg53")
	run("ip", "-n", s.guests["zonea"].NS, "route", "add", second+"/32", "dev", "leg53", "src", host)
	s.set(t, ctx, "zonea", Policy{Mode: "open"})
	s.set(t, ctx, "zoneb", Policy{Mode: "open"})
	if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err != nil || len(got) != 1 || got[0] != testvm.InternetAddr {
		t.Fatalf("zonea's own guest: %v, %v", got, err)
	}
	// the node's way back to the host: out of zonea's vnet, not zoneb's
	if out := run("ip", "-n", s.b.NodeNS(), "-o", "route", "get", host, "from", second); !strings.Contains(out, "dev "+s.bridge["zonea"]+" ") {
		t.Errorf("the node's route to %s from %s: %s; want zonea's vnet %s", host, second, out, s.bridge["zonea"])
	}
	before := guardDrops(t, s.g, "guest_in", "egress-rpf-resolver-udp")
	if got, err := resolveFrom(s, host+":0", testvm.InternetName, second+":53", 2*time.Second); err == nil {
		t.Errorf("a host of the shared subnet on zoneb's segment got %s: %v; want no answer", testvm.InternetName, got)
	}
	if after := guardDrops(t, s.g, "guest_in", "egress-rpf-resolver-udp"); after <= before {
		t.Errorf("egress-rpf-resolver-udp counted %v drops, before %v: want more", after, before)
	}
}
