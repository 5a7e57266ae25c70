package firewall

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// scaleInput is a node with n zone bridges, each with one guest port and
// its peer, and one zone per bridge.
func scaleInput(n int) (Config, Classification, []Port) {
	cfg := Config{DnsmasqUser: "65534", Zones: map[string][]string{}}
	cls := Classification{Management: []string{"eth0"}, Interfaces: []string{"eth0", "lo"}}
	var ports []Port
	for i := range n {
		v, p := fmt.Sprintf("v%04d", i), fmt.Sprintf("tap%di0", 1000+i)
		cfg.Zones[fmt.Sprintf("z%04d", i)] = []string{v}
		cls.Interfaces = append(cls.Interfaces, v, p, fmt.Sprintf("tp%d", 1000+i))
		cls.Enslaved = append(cls.Enslaved, Enslaved{Port: p, Bridge: v})
		ports = append(ports, Port{Name: p, MAC: net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)},
			IPv4: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(16 + i/256), byte(i), 100})}})
	}
	cls.Interfaces = sortedUnique(cls.Interfaces)
	return cfg, cls, ports
}

func BenchmarkRenderScale(b *testing.B) {
	for _, n := range []int{1, 500, 2000} {
		cfg, cls, ports := scaleInput(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := Render(cfg, cls, Switches{}); err != nil {
					b.Fatal(err)
				}
				if _, err := RenderBridge(zoneBridges(cfg), cls, ports, cfg.Flood); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPatchScale is the in-memory part of one new bridge at each
// size: the interface's members from two small renderings, and the patch
// of @zone_peers (applied and undone).
func BenchmarkPatchScale(b *testing.B) {
	for _, n := range []int{1, 500, 2000} {
		cfg, cls, ports := scaleInput(n)
		rs, err := Render(cfg, cls, Switches{})
		if err != nil {
			b.Fatal(err)
		}
		brs, err := RenderBridge(zoneBridges(cfg), cls, ports, cfg.Flood)
		if err != nil {
			b.Fatal(err)
		}
		g := &Guard{cfg: cfg, desired: normalized(rs), bridge: normalized(brs), state: cls}
		g.indexZonesLocked(nil)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				cs := &changes{}
				if err := g.interfaceDelta(cs, cls, []string{"n0001"}, true); err != nil {
					b.Fatal(err)
				}
				for _, c := range cs.list {
					if !c.empty() {
						cur := g.desired.Set(c.set)
						add, del := effective(cur, c)
						patch(cur, add, del)
						patch(cur, del, add) // undo, for the next round
					}
				}
			}
		})
	}
}

// BenchmarkGuardApply is the guard's whole apply on the bed's node: Start
// in a fresh namespace (the table in one batch, then read back and
// verified), today's ruleset.
func BenchmarkGuardApply(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		n := basicNode(b)
		cfg := testConfig(b)
		g, err := New(cfg, WithNetNS(n.Handle()))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := g.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		b.ReportMetric(float64(g.Desired().RuleCount()+g.BridgeDesired().RuleCount()), "rules")
		g.Close()
		n.DropHandles()
		b.StartTimer()
	}
}

// BenchmarkGuardVerify is one verify of a started guard on the bed's node:
// both tables read back and compared with the desired ones.
func BenchmarkGuardVerify(b *testing.B) {
	n := basicNode(b)
	g, err := New(testConfig(b), WithNetNS(n.Handle()))
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := g.Verify(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
