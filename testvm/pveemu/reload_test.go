package pveemu

import (
	"net/url"
	"slices"
	"testing"
	"time"
)

// TestConcurrentApplyLosesItsReload: nothing serialises two SDN applies,
// and ifupdown2's lock does not wait. An apply whose node reload starts
// while another apply's reload runs there ends OK with its zone made
// nowhere; the next apply makes it.
func TestConcurrentApplyLosesItsReload(t *testing.T) {
	e := newEnv(t)
	held, release := e.s.HoldReloads()
	defer release()
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"za"}, "type": {"simple"}, "ipam": {"pve"}})
	first := e.ok("PUT", "/cluster/sdn", nil).(string)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first apply's reload never started")
	}
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"zb"}, "type": {"simple"}, "ipam": {"pve"}})
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatalf("the second apply: %s, want OK (its lost reload says nothing)", st)
	}
	release()
	if st := e.wait(first); st != "OK" {
		t.Fatalf("the first apply: %s", st)
	}
	if z := e.fb.Zones(); !slices.Equal(z, []string{"za"}) {
		t.Errorf("zones made after both applies: %v, want only the first's", z)
	}
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatal(st)
	}
	if z := e.fb.Zones(); !slices.Equal(z, []string{"za", "zb"}) {
		t.Errorf("zones after a third apply: %v", z)
	}
}
