package egress

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestSharedGatewayOnBed: a guest connection the guard redirected to the
// resolver's TCP listener or the proxy is attributed to the interface it
// came in on, also when another guest bridge holds the same address (two
// zones of one gateway: Proxmox allows one range in two zones, and a
// tenant with SDN rights can make one beside a sandbox's). The redirect
// makes the connection's local address the first address of the bridge it
// came in on, which names no interface when two hold it: attributed by
// that address, zoneb's guest got zonea's policy, quota and record.
func TestSharedGatewayOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	inet := testvm.InternetAddr
	other := "other." + testvm.InternetName // same address as the internet name
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "allowlist", Allow: []string{other}})
	// zonea's gateway becomes vnetb's first address (the one a redirect
	// of vnetb's guests goes to); vnetb keeps its own after it
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", s.b.NodeNS()}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("addr", "del", s.gw["zoneb"]+"/24", "dev", s.bridge["zoneb"])
	ip("addr", "add", s.gw["zonea"]+"/32", "dev", s.bridge["zoneb"])
	ip("addr", "add", s.gw["zoneb"]+"/24", "dev", s.bridge["zoneb"])

	// DNS over TCP from zoneb: zonea's name is not zoneb's (over UDP the
	// read loop names the interface by IP_PKTINFO)
	for _, tcp := range []bool{false, true} {
		if got, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", tcp); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
			t.Errorf("zoneb asked for zonea's name (tcp=%v): %v, %v; want NXDOMAIN", tcp, got, err)
		}
	}
	// the proxy: zoneb's own name opens the address; zonea's name on it is
	// refused
	if got, err := s.resolve("zoneb", other, s.gw["zoneb"]+":53", false); err != nil || len(got) != 1 || got[0] != inet {
		t.Fatalf("zoneb's own name: %v, %v", got, err)
	}
	if body, err := s.get("zoneb", "http://"+other+"/", inet+":80"); err != nil || body != "internet host" {
		t.Errorf("zoneb's own name through the proxy: %q, %v", body, err)
	}
	if body, err := s.get("zoneb", "http://"+testvm.InternetName+"/", inet+":80"); err == nil {
		t.Errorf("zoneb reached zonea's name through the proxy: %q", body)
	}
	// zonea's guest is still zonea's
	for _, tcp := range []bool{false, true} {
		if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", tcp); err != nil || len(got) != 1 || got[0] != inet {
			t.Errorf("zonea's own name (tcp=%v): %v, %v", tcp, got, err)
		}
	}
	if n := len(s.den.Recent("sb-zoneb")); n == 0 {
		t.Errorf("no denial recorded for sb-zoneb; sb-zonea has %+v", s.den.Recent("sb-zonea"))
	}
}
