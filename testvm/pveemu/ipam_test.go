package pveemu

import (
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestFixedAddressByMAC: the pve IPAM's DHCP mapping as pve-network and
// qemu-server make it (FIDELITY.md row 6): POST .../ips takes any address
// of a running subnet the IPAM does not hold (the network address too;
// not the gateway, not one outside), stores the MAC as sent with no VM,
// and of two concurrent creates of one address exactly one wins. A NIC
// configured with that MAC gets a range address all the same (the MAC's
// second entry), and a start maps the MAC's cached address, the range
// one; once that entry is deleted with the MAC, the start maps the fixed
// address. A destroy removes the entry the cache names and leaves the
// MAC's other one; a delete without the MAC leaves its cached address.
func TestFixedAddressByMAC(t *testing.T) {
	e := newEnv(t)
	e.setupZone() // vnet1: 10.10.1.0/24, gateway .1, range .100-.200
	ips := func(form url.Values) resp {
		t.Helper()
		form.Set("zone", "sbx1")
		return e.do("POST", "/cluster/sdn/vnets/vnet1/ips", form, authTicket)
	}
	for _, tc := range []struct {
		ip, msg string
	}{
		{"10.10.1.1", "IP '10.10.1.1' already exist\n"},
		{"10.10.2.5", "can't find any subnet for ip 10.10.2.5\n"},
	} {
		if r := ips(url.Values{"ip": {tc.ip}}); r.status != 500 || r.body["message"] != tc.msg {
			t.Errorf("POST ip %s: %d %v, want %q", tc.ip, r.status, r.body, tc.msg)
		}
	}
	if r := ips(url.Values{"ip": {"10.10.1.0"}}); r.status != 200 {
		t.Errorf("the network address: %d %v, want taken as any other", r.status, r.body)
	}
	e.ok("DELETE", "/cluster/sdn/vnets/vnet1/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.1.0"}})

	// two creates of one address at once: one wins, the other is refused
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = ips(url.Values{"ip": {"10.10.1.150"}, "mac": {"02:00:00:00:00:0" + string(rune('b'+i))}}).status
		}()
	}
	wg.Wait()
	if slices.Sort(codes); !slices.Equal(codes, []int{200, 500}) {
		t.Errorf("two concurrent creates of one address: %v, want one 200 and one 500", codes)
	}
	e.ok("DELETE", "/cluster/sdn/vnets/vnet1/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.1.150"}})

	// the first range address reserved for a MAC in lower case, the
	// second for another
	const m120, m121 = "02:00:00:00:00:0a", "02:00:00:00:00:0C"
	ips(url.Values{"ip": {"10.10.1.100"}, "mac": {m120}})
	ips(url.Values{"ip": {"10.10.1.160"}, "mac": {m121}})
	status := e.ok("GET", "/cluster/sdn/ipams/pve/status", nil).([]any)
	if m := status[1].(map[string]any); m["ip"] != "10.10.1.100" || m["mac"] != m120 || m["vmid"] != nil {
		t.Errorf("the reserved entry %v, want the MAC as sent and no vmid", m)
	}
	for _, vm := range []struct{ id, mac string }{{"120", m120}, {"121", m121}} { // in this order: 120 takes .101
		id, mac := vm.id, vm.mac
		e.clone(id)
		if st := e.task("POST", "/nodes/pve/qemu/"+id+"/config", url.Values{"net0": {"virtio=" + mac + ",bridge=vnet1"}}); st != "OK" {
			t.Fatalf("config %s: %s", id, st)
		}
	}
	// each MAC has its reservation and a range address (.101 and .102:
	// .100 is taken)
	want := []string{"10.10.1.0/24 10.10.1.1 gateway", "10.10.1.0/24 10.10.1.100 " + m120, "10.10.1.0/24 10.10.1.101 " + m120,
		"10.10.1.0/24 10.10.1.102 " + m121, "10.10.1.0/24 10.10.1.160 " + m121}
	if got := e.s.IPAMEntries("sbx1"); !slices.Equal(got, want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
	// 120's range entry deleted with its MAC (the daemon's step); 121's
	// kept
	e.ok("DELETE", "/cluster/sdn/vnets/vnet1/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.1.101"}, "mac": {m120}})
	for _, id := range []string{"120", "121"} {
		if st := e.task("POST", "/nodes/pve/qemu/"+id+"/status/start", nil); st != "OK" {
			t.Fatalf("start %s: %s", id, st)
		}
	}
	calls := strings.Join(e.fb.Calls(), "\n")
	for _, line := range []string{"start 120 vnet=vnet1 mac=" + m120 + " ip=10.10.1.100", "start 121 vnet=vnet1 mac=" + strings.ToLower(m121) + " ip=10.10.1.102"} {
		if !strings.Contains(calls, line) {
			t.Errorf("backend calls lack %q:\n%s", line, calls)
		}
	}
	for _, id := range []string{"120", "121"} {
		if st := e.task("POST", "/nodes/pve/qemu/"+id+"/status/stop", nil); st != "OK" {
			t.Fatal(st)
		}
		if st := e.task("DELETE", "/nodes/pve/qemu/"+id, url.Values{"purge": {"1"}}); st != "OK" {
			t.Fatal(st)
		}
	}
	want = []string{"10.10.1.0/24 10.10.1.1 gateway", "10.10.1.0/24 10.10.1.160 " + m121}
	if got := e.s.IPAMEntries("sbx1"); !slices.Equal(got, want) {
		t.Errorf("after the destroys %q, want %q (121's reservation: its cache named the range address)", got, want)
	}
	// the cache names neither MAC; the concurrent create's winner is
	// left in it: its entry was deleted without the MAC
	if c := e.s.MACCache(); len(c) != 1 || !strings.HasSuffix(c[0], " 10.10.1.150") {
		t.Errorf("MAC cache %q after the destroys, want only the winner of .150", c)
	}
}

// TestDHCPRangesInOrder: a subnet's several dhcp-range entries as
// pve-network takes them (FIDELITY.md, issue 37 rows): overlapping ranges
// are refused (SubnetPlugin.pm validate_dhcp_ranges); NICs get the first
// free address of the ranges in the order given, not sorted (Subnets.pm
// add_next_free_ip, PVEPlugin.pm add_range_next_freeip), a full range
// passing to the next; with every range full the config fails "can't find
// any free ip" (Vnets.pm add_next_free_cidr); of two configs racing for
// the last free address one gets it and the other fails.
func TestDHCPRangesInOrder(t *testing.T) {
	e := newEnv(t)
	// vnet2: the template's NIC is on vnet1 (absent here), so its clones
	// take no address until configured
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"sbx1"}, "type": {"simple"}, "ipam": {"pve"}, "dhcp": {"dnsmasq"}})
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet2"}, "zone": {"sbx1"}})
	r := e.do("POST", "/cluster/sdn/vnets/vnet2/subnets", url.Values{"subnet": {"10.10.1.0/24"}, "type": {"subnet"}, "gateway": {"10.10.1.1"},
		"dhcp-range": {"start-address=10.10.1.10,end-address=10.10.1.20", "start-address=10.10.1.20,end-address=10.10.1.30"}}, authTicket)
	if msg, _ := r.body["message"].(string); r.status == 200 || !strings.Contains(msg, "dhcp ranges must not overlap") {
		t.Fatalf("overlapping ranges: %d %v", r.status, r.body)
	}
	e.ok("POST", "/cluster/sdn/vnets/vnet2/subnets", url.Values{"subnet": {"10.10.1.0/24"}, "type": {"subnet"}, "gateway": {"10.10.1.1"},
		"dhcp-range": {"start-address=10.10.1.150,end-address=10.10.1.151", "start-address=10.10.1.100,end-address=10.10.1.100"}})
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatalf("sdn apply: %s", st)
	}
	if got, want := e.s.SubnetDHCPRanges("sbx1"), []string{"10.10.1.0/24 10.10.1.150-10.10.1.151,10.10.1.100-10.10.1.100"}; !slices.Equal(got, want) {
		t.Fatalf("subnet ranges %q, want %q", got, want)
	}
	config := func(id string) string {
		t.Helper()
		e.clone(id)
		return e.task("POST", "/nodes/pve/qemu/"+id+"/config", url.Values{"net0": {"virtio=02:00:00:00:01:" + id[1:] + ",bridge=vnet2"}})
	}
	for _, id := range []string{"120", "121"} {
		if st := config(id); st != "OK" {
			t.Fatalf("config %s: %s", id, st)
		}
	}
	// the first range is full: one address of the second is left, and two
	// configs race for it
	e.clone("122")
	e.clone("123")
	var wg sync.WaitGroup
	st := make([]string, 2)
	for i, id := range []string{"122", "123"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st[i] = e.task("POST", "/nodes/pve/qemu/"+id+"/config", url.Values{"net0": {"virtio=02:00:00:00:01:" + id[1:] + ",bridge=vnet2"}})
		}()
	}
	wg.Wait()
	slices.Sort(st)
	if st[0] != "OK" || !strings.Contains(st[1], "can't find any free ip in zone sbx1 for IPv4") {
		t.Errorf("two configs racing for the last address: %q, want one OK and one without a free ip", st)
	}
	var got []string
	for _, l := range e.s.IPAMEntries("sbx1") {
		got = append(got, strings.Fields(l)[1])
	}
	if want := []string{"10.10.1.1", "10.10.1.100", "10.10.1.150", "10.10.1.151"}; !slices.Equal(got, want) {
		t.Errorf("IPAM addresses %q, want %q: the ranges in their order, then nothing", got, want)
	}
}

// TestSubnetWithoutRangeAllocatesFromPrefix: a NIC on a subnet without a
// dhcp-range, in a zone with the pve IPAM and DHCP, gets an address of the
// whole prefix as current pve-network gives it (FIDELITY.md row 6; Subnets.pm
// add_next_free_ip without a range calls PVEPlugin.pm add_next_freeip):
// the first address after the network's that the IPAM does not hold (.2:
// the gateway holds .1; a reserved address is skipped), when configured
// and, for a NIC without one, at start (Vnets.pm add_dhcp_mapping). The
// IPAM status lists the entry, the backend is told to serve the subnet
// (a static range) and the start maps the address. A full prefix (the
// broadcast address is never given) fails the config with
// add_next_freeip's error.
func TestSubnetWithoutRangeAllocatesFromPrefix(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"sbx1"}, "type": {"simple"}, "ipam": {"pve"}, "dhcp": {"dnsmasq"}})
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet2"}, "zone": {"sbx1"}})
	e.ok("POST", "/cluster/sdn/vnets/vnet2/subnets", url.Values{"subnet": {"10.10.3.0/29"}, "type": {"subnet"}, "gateway": {"10.10.3.1"}})
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatalf("sdn apply: %s", st)
	}
	if v, ok := e.fb.VNet("vnet2"); !ok || !v.StaticDHCP || len(v.DHCP) != 0 {
		t.Fatalf("applied vnet %+v, want a static DHCP range and no ranges", v)
	}
	mac := func(id string) string { return "02:00:00:00:03:" + id[1:] }
	config := func(id string) string {
		t.Helper()
		e.clone(id)
		return e.task("POST", "/nodes/pve/qemu/"+id+"/config", url.Values{"net0": {"virtio=" + mac(id) + ",bridge=vnet2"}})
	}
	if st := config("120"); st != "OK" {
		t.Fatalf("config 120: %s", st)
	}
	status := e.ok("GET", "/cluster/sdn/ipams/pve/status", nil).([]any)
	if len(status) != 2 {
		t.Fatalf("IPAM status %v, want the gateway and 120's entry", status)
	}
	if m := status[1].(map[string]any); m["ip"] != "10.10.3.2" || m["mac"] != mac("120") || m["vmid"] != float64(120) || m["vnet"] != "vnet2" || m["subnet"] != "10.10.3.0/29" {
		t.Errorf("120's entry %v, want 10.10.3.2 of its MAC and VM on vnet2", m)
	}
	// .3 reserved: the next NIC skips it
	e.ok("POST", "/cluster/sdn/vnets/vnet2/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.3.3"}, "mac": {"02:00:00:00:03:ff"}})
	for _, id := range []string{"121", "122", "123"} {
		if st := config(id); st != "OK" {
			t.Fatalf("config %s: %s", id, st)
		}
	}
	var got []string
	for _, l := range e.s.IPAMEntries("sbx1") {
		got = append(got, strings.Fields(l)[1]+" "+strings.Fields(l)[2])
	}
	want := []string{"10.10.3.1 gateway", "10.10.3.2 " + mac("120"), "10.10.3.3 02:00:00:00:03:ff", "10.10.3.4 " + mac("121"),
		"10.10.3.5 " + mac("122"), "10.10.3.6 " + mac("123")}
	if !slices.Equal(got, want) {
		t.Fatalf("IPAM entries %q, want %q", got, want)
	}
	// .7 is the broadcast address: the prefix is full
	if st := config("124"); !strings.Contains(st, "can't find free ip in subnet '10.10.3.0/29'") {
		t.Errorf("config on a full prefix: %q, want add_next_freeip's error", st)
	}
	// 120's entry gone with its MAC: its start allocates again, and maps it
	e.ok("DELETE", "/cluster/sdn/vnets/vnet2/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.3.2"}, "mac": {mac("120")}})
	if st := e.task("POST", "/nodes/pve/qemu/120/status/start", nil); st != "OK" {
		t.Fatalf("start 120: %s", st)
	}
	if line := "start 120 vnet=vnet2 mac=" + mac("120") + " ip=10.10.3.2"; !strings.Contains(strings.Join(e.fb.Calls(), "\n"), line) {
		t.Errorf("backend calls lack %q:\n%s", line, strings.Join(e.fb.Calls(), "\n"))
	}
}

// TestFreeIPOfPrefix: add_next_freeip's walk (PVEPlugin.pm) over the
// prefixes NetAddr::IP bounds: from the address after the network's to
// last() (the broadcast address less one; a /31's broadcast address), a
// /32 its network address, and its two errors.
func TestFreeIPOfPrefix(t *testing.T) {
	held := func(ips ...string) map[string]*ipamEntry {
		db := map[string]*ipamEntry{}
		for _, ip := range ips {
			db[ip] = &ipamEntry{}
		}
		return db
	}
	for _, tc := range []struct {
		cidr string
		db   map[string]*ipamEntry
		want string // the address, or the error
	}{
		{"10.0.0.0/24", held("10.0.0.1"), "10.0.0.2"},
		{"10.0.0.0/24", held(), "10.0.0.1"},
		{"10.0.0.0/24", held("10.0.0.1", "10.0.0.2", "10.0.0.4"), "10.0.0.3"},
		{"10.0.0.0/30", held("10.0.0.1"), "10.0.0.2"},
		{"10.0.0.0/30", held("10.0.0.1", "10.0.0.2"), "can't find free ip in subnet '10.0.0.0/30'"},
		{"10.0.0.0/31", held(), "10.0.0.1"},
		{"10.0.0.0/31", held("10.0.0.1"), "can't find free ip in subnet '10.0.0.0/31'"},
		{"10.0.0.4/32", held(), "10.0.0.4"},
		{"10.0.0.4/32", held("10.0.0.4"), "cannot find free IP in subnet '10.0.0.4/32'"},
	} {
		got, err := freeIPOfPrefix(netip.MustParsePrefix(tc.cidr), tc.db)
		s := got.String()
		if err != nil {
			s = strings.TrimSpace(err.Error())
		}
		if s != tc.want {
			t.Errorf("%s held %d: %q, want %q", tc.cidr, len(tc.db), s, tc.want)
		}
	}
}
