package sandbox

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestStateMigration: a state file written by the version 1 daemon
// (testdata/state-v1.json, kept as written) loads into the same sandboxes
// as the version 2 file the previous daemon wrote (testdata/state-v2.json,
// kept as written) and the version 3 file the one before wrote
// (testdata/state-v3.json, kept as written: its rewrite with a VM's fixed
// NIC and a pool member) and the version 4 file the one before wrote
// (testdata/state-v4.json, kept as written: a container added); its
// version 5 rewrite (testdata/state-v5.json, golden, with a Windows VM's
// options and a network's own DHCP ranges added) loads back the same, and
// a network of an older file gets its plan's range; warm pool members
// stay apart from sandboxes; files of an unknown version are refused with
// a clear error.
func TestStateMigration(t *testing.T) {
	v1, err := os.ReadFile("testdata/state-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	node, fromV1, _, err := decodeState(v1)
	if err != nil || node != "node1" || len(fromV1) != 2 {
		t.Fatalf("version 1: node %q, %d sandboxes, %v", node, len(fromV1), err)
	}
	if fromV1[1].Labels["eval"] != "ctf-1" || fromV1[0].Owner != "alice" || fromV1[0].Networks[0].CIDR != "192.168.50.0/24" || fromV1[1].VMs[1].DiskGiB != 20 {
		t.Errorf("version 1 decoded wrong: %+v", fromV1)
	}
	v2, err := os.ReadFile("testdata/state-v2.json")
	if err != nil {
		t.Fatal(err)
	}
	_, fromV2, members, err := decodeState(v2)
	if err != nil || !reflect.DeepEqual(fromV2, fromV1) || len(members) != 0 {
		t.Errorf("version 2: %v, %d members\n%+v\nwant %+v", err, len(members), fromV2, fromV1)
	}
	member := memberState{Sandbox: fromV1[0], Shape: "small", Template: 9000}
	member.Sandbox.ID = "sbpool01"
	fromV1[1].FromPool = true
	fromV1[1].VMs[0].NICs = []apitype.NIC{{Network: "net0", MAC: "02:00:00:00:00:0A", IPv4: "10.200.0.5"}}
	v3, err := os.ReadFile("testdata/state-v3.json")
	if err != nil {
		t.Fatal(err)
	}
	_, fromV3, members, err := decodeState(v3)
	if err != nil || !reflect.DeepEqual(fromV3, fromV1) || !reflect.DeepEqual(members, []memberState{member}) {
		t.Errorf("version 3: %v\n%+v\nwant %+v\nmembers %+v", err, fromV3, fromV1, members)
	}
	fromV1[1].VMs[1].Kind = apitype.KindLXC
	v4, err := os.ReadFile("testdata/state-v4.json")
	if err != nil {
		t.Fatal(err)
	}
	_, fromV4, members, err := decodeState(v4)
	if err != nil || !reflect.DeepEqual(fromV4, fromV1) || !reflect.DeepEqual(members, []memberState{member}) {
		t.Errorf("version 4: %v\n%+v\nwant %+v\nmembers %+v", err, fromV4, fromV1, members)
	}
	// a network of DHCP from a file without ranges has its plan's
	if got := fromV1[0].Networks[0]; !got.DHCP || !slices.Equal(got.DHCPRanges, []apitype.DHCPRange{{Start: "192.168.50.10", End: "192.168.50.254"}}) {
		t.Errorf("version 1 network %+v, want the plan's range", got)
	}
	fromV1[1].VMs[0].OSType, fromV1[1].VMs[0].CPU = "win11", "x86-64-v3"
	// a request's ranges are kept as given, in order
	fromV1[1].Networks[0].DHCPRanges = []apitype.DHCPRange{{Start: "10.200.0.200", End: "10.200.0.210"}, {Start: "10.200.0.50", End: "10.200.0.60"}}
	v5, err := os.ReadFile("testdata/state-v5.json")
	if err != nil {
		t.Fatal(err)
	}
	_, fromV5, members, err := decodeState(v5)
	if err != nil || !reflect.DeepEqual(fromV5, fromV1) || !reflect.DeepEqual(members, []memberState{member}) {
		t.Errorf("version 5: %v\n%+v\nwant %+v\nmembers %+v", err, fromV5, fromV1, members)
	}
	// version 6: a VM without a guest agent (in a sandbox only: the pool
	// member made of the same record above shares its VMs, and a member
	// always has an agent, its refill pinged it)
	fromV1[0].VMs = slices.Clone(fromV1[0].VMs)
	fromV1[0].VMs[0].Agent = new(bool)
	v6, err := encodeState(node, fromV1, []memberState{member})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "state-v6.json", v6)
	_, fromV6, members, err := decodeState(v6)
	if err != nil || !reflect.DeepEqual(fromV6, fromV1) || !reflect.DeepEqual(members, []memberState{member}) {
		t.Errorf("version 6 round trip: %v\n%+v\nwant %+v\nmembers %+v", err, fromV6, fromV1, members)
	}
	if fromV6[0].VMs[0].HasAgent() || !fromV6[1].VMs[0].HasAgent() {
		t.Errorf("version 6: agents %v %v, want the first VM without one", fromV6[0].VMs[0].HasAgent(), fromV6[1].VMs[0].HasAgent())
	}
	for doc, msg := range map[string]string{
		`{"version": 7, "node": "node1", "sandboxes": []}`: "version 7",
		`{"node": "node1", "sandboxes": []}`:               "no version",
		`{"version": "2"}`:                                 "cannot unmarshal",
		`[]`:                                               "cannot unmarshal",
	} {
		if _, _, _, err := decodeState([]byte(doc)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want an error naming %q", doc, err, msg)
		}
	}
}

// TestStateVMOptions: a VM's per-VM options survive the state file (a
// restarted daemon still reaches a Windows VM through its Windows guest
// client and refuses its containment check, and knows a VM without a
// guest agent for one), and a VM without them is written without an
// options object.
func TestStateVMOptions(t *testing.T) {
	sb := apitype.Sandbox{ID: "sbopts", VMs: []apitype.VM{
		{Name: "win", VMID: 101, OSType: "win11", Firmware: "uefi", CPU: "host", DiskController: "scsi", NICController: "virtio"},
		{Name: "lin", VMID: 102},
		{Name: "victim", VMID: 103, DiskController: "ide", NICController: "e1000", Agent: new(bool)},
	}}
	b, err := encodeState("pve", []apitype.Sandbox{sb}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"options"`); n != 2 {
		t.Errorf("%d options objects, want 2:\n%s", n, b)
	}
	_, got, _, err := decodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got[0].VMs, sb.VMs) {
		t.Errorf("VMs after the round trip %+v, want %+v", got[0].VMs, sb.VMs)
	}
}

// TestStateNoNetwork: a VM created without any NIC keeps its flag across
// the state file (no new version: a daemon that does not know the flag
// reads the VM's empty networks), its networks written as [] and read
// back as an empty list, so that the API answers "networks": [], never
// null (also when the record held nil).
func TestStateNoNetwork(t *testing.T) {
	sb := apitype.Sandbox{ID: "sbnonet", Networks: []apitype.Network{{Name: "net0"}}, VMs: []apitype.VM{
		{Name: "vault", VMID: 101, Networks: []string{}, NoNetwork: true},
		{Name: "box", VMID: 102, Networks: []string{"net0"}},
		{Name: "odd", VMID: 103, NoNetwork: true},
	}}
	b, err := encodeState("pve", []apitype.Sandbox{sb}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "null") || strings.Count(string(b), `"networks": []`) != 2 || strings.Count(string(b), `"no_network": true`) != 2 {
		t.Errorf("want two VMs of networks [] and no_network, no null:\n%s", b)
	}
	if !strings.Contains(string(b), `"version": 6`) {
		t.Errorf("want version 6 still:\n%s", b)
	}
	_, got, _, err := decodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	vms := got[0].VMs
	if !vms[0].NoNetwork || vms[1].NoNetwork || !vms[2].NoNetwork {
		t.Errorf("no_network after the round trip: %v %v %v, want the first and the last", vms[0].NoNetwork, vms[1].NoNetwork, vms[2].NoNetwork)
	}
	for _, v := range vms {
		a, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if v.Networks == nil || strings.Contains(string(a), `"networks":null`) {
			t.Errorf("vm %s answers %s: want its networks a list", v.Name, a)
		}
	}
}
