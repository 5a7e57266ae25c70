package pveemu

import (
	"context"
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
	case <-time.After(time.Minute):
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

// slowZoneBackend is the fake node whose apply of one zone waits until
// released (a reload that has made some zones and is making the next).
type slowZoneBackend struct {
	*FakeBackend
	zone    string
	blocked chan struct{} // closed when the zone's apply waits
	release chan struct{}
}

func (b *slowZoneBackend) ApplyZone(ctx context.Context, z ZoneSpec) error {
	if z.ID == b.zone {
		close(b.blocked)
		<-b.release
	}
	return b.FakeBackend.ApplyZone(ctx, z)
}

// TestStartSeesABridgeItsReloadMade: a VM's start checks the bridge
// device itself (pve-bridge's tap_create reads its mtu), so a bridge the
// node's running reload has made serves a start before that reload ends
// (here: while it makes the next zone), as it does the daemon's check of
// its bridges.
func TestStartSeesABridgeItsReloadMade(t *testing.T) {
	e := newEnv(t)
	slow := &slowZoneBackend{FakeBackend: e.fb, zone: "sbx2", blocked: make(chan struct{}), release: make(chan struct{})}
	e.s.mu.Lock()
	e.s.backend = slow
	e.s.mu.Unlock()
	for _, z := range []string{"sbx1", "sbx2"} {
		e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {z}, "type": {"simple"}})
	}
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet1"}, "zone": {"sbx1"}})
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet2"}, "zone": {"sbx2"}})
	e.clone("100")
	apply := e.ok("PUT", "/cluster/sdn", nil).(string)
	select {
	case <-slow.blocked:
	case <-time.After(time.Minute):
		t.Fatal("the reload never reached the second zone")
	}
	st := e.task("POST", "/nodes/pve/qemu/100/status/start", nil)
	close(slow.release)
	if ast := e.wait(apply); ast != "OK" {
		t.Fatalf("apply: %s", ast)
	}
	if st != "OK" {
		t.Errorf("start on a bridge the running reload has made: %s", st)
	}
}
