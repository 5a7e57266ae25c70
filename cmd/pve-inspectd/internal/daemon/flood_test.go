package daemon

import (
	"slices"
	"testing"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
)

// TestGuardConfigFlood: the [guard] flood keys reach the firewall's
// configuration, the daemon's listener ports among the management ports.
func TestGuardConfigFlood(t *testing.T) {
	c, err := config.Parse("[guard]\nmanagement_ports = [22]\nconn_limit = 9\npacket_rate = 8\npacket_burst = 7\nport_arp_rate = 6\nport_arp_burst = 5\nport_broadcast_rate = 4\nport_broadcast_burst = 3\nnode_conn_limit = 1000\ndns_rate = 1\ndns_burst = 10\n[metrics]\nlisten = \"127.0.0.1:9100\"\n")
	if err != nil {
		t.Fatal(err)
	}
	f := GuardConfig(c.Guard).Flood
	if !slices.Equal(f.ManagementPorts, []uint16{22, 9100}) || f.ConnLimit != 9 || f.PacketRate != 8 || f.PacketBurst != 7 ||
		f.PortARPRate != 6 || f.PortARPBurst != 5 || f.PortBroadcastRate != 4 || f.PortBroadcastBurst != 3 ||
		f.NodeConnLimit != 1000 || f.DNSRate != 1 || f.DNSBurst != 10 {
		t.Errorf("flood config %+v", f)
	}
}
