package firewall

import (
	"context"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// testNS is a named network namespace created for one test and removed by
// its cleanup (testkit.NewNetNS), with the firewall tests' nft helper.
type testNS struct{ *testkit.NetNS }

func newTestNS(t testing.TB) *testNS { return &testNS{testkit.NewNetNS(t, "pgd")} }

// nft runs nft inside the namespace and returns its combined output.
func (n *testNS) nft(t testing.TB, args ...string) (string, error) {
	t.Helper()
	out, err := n.Command(context.Background(), append([]string{"nft"}, args...)...).CombinedOutput()
	return string(out), err
}

// basicNode is the fixed interface set of the tests: uplink eth0 with the
// default route, a trusted storage NIC, two vnet bridges (dummies).
func basicNode(t testing.TB) *testNS {
	n := newTestNS(t)
	eth0 := n.Bridge(t, "eth0", "192.0.2.2/24")
	n.Bridge(t, "stor0", "10.99.0.2/24")
	n.Bridge(t, "vnetA", "10.10.1.1/24")
	n.Bridge(t, "vnetB", "10.10.2.1/24")
	n.DefaultVia(t, eth0, "192.0.2.1")
	return n
}

func testConfig(t testing.TB) Config {
	return Config{
		Trusted:       []string{"stor0"},
		DnsmasqUser:   "65534",
		Zones:         map[string][]string{"zone1": {"vnetA", "vnetA2"}},
		Private4Allow: nil,
		ProcRoot:      t.TempDir(),
		StateDir:      t.TempDir(),
	}
}
