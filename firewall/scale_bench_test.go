package firewall

import (
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
				if _, err := RenderBridge(zoneBridges(cfg), cls, ports); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
