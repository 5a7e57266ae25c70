package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestMergeHosts: the managed block goes first, replaces every earlier
// block whole, keeps the guest's other lines, and a second merge with the
// same block changes nothing.
func TestMergeHosts(t *testing.T) {
	block := []byte(hostsBegin + "\n10.0.0.10\tattacker\n10.0.0.11\ttarget\n" + hostsEnd + "\n")
	old := hostsBegin + "\n10.9.9.9\ttarget\n10.9.9.8\tstale\n" + hostsEnd + "\n"
	for _, tc := range []struct {
		name, existing, want string
	}{
		{"fresh file", hostsBase, string(block) + hostsBase},
		{"empty file", "", string(block)},
		{"guest lines kept after the block", "127.0.0.1 localhost\n192.0.2.7 target\n", string(block) + "127.0.0.1 localhost\n192.0.2.7 target\n"},
		{"an earlier block replaced, not appended", old + "127.0.0.1 localhost\n", string(block) + "127.0.0.1 localhost\n"},
		{"a block in the middle", "127.0.0.1 localhost\n" + old + "::1 localhost\n", string(block) + "127.0.0.1 localhost\n::1 localhost\n"},
		{"two earlier blocks", old + "a\n" + old, string(block) + "a\n"},
		{"a begin marker without its end: the marker goes, the lines stay", hostsBegin + "\n10.9.9.9 target\n", string(block) + "10.9.9.9 target\n"},
		{"a stray end marker", "a\n" + hostsEnd + "\nb\n", string(block) + "a\nb\n"},
		{"CRLF markers", strings.ReplaceAll(old, "\n", "\r\n") + "a\n", string(block) + "a\n"},
		{"no final newline", "127.0.0.1 localhost", string(block) + "127.0.0.1 localhost\n"},
		{"binary junk kept as the guest's", "\x00\xff junk\n", string(block) + "\x00\xff junk\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeHosts([]byte(tc.existing), block)
			if string(got) != tc.want {
				t.Fatalf("merge:\n%q\nwant\n%q", got, tc.want)
			}
			if again := mergeHosts(got, block); !bytes.Equal(again, got) {
				t.Fatalf("a second merge changed the file:\n%q\nto\n%q", got, again)
			}
		})
	}
}

// TestVMAddresses: each VM gets its own IPAM address on each of its
// networks, in NIC order; entries of other vnets (another sandbox), other
// VMIDs, gateways (vmid 0) and IPv6 are ignored; of two entries the lower
// wins.
func TestVMAddresses(t *testing.T) {
	nets := []apitype.Network{{Name: "lan", VNet: "sbaaav0"}, {Name: "dmz", VNet: "sbaaav1"}}
	vms := []apitype.VM{{Name: "attacker", VMID: 101, Networks: []string{"dmz", "lan"}}, {Name: "target", VMID: 102, Networks: []string{"lan"}}, {Name: "off", VMID: 103, Networks: []string{"lan"}}}
	a := netip.MustParseAddr
	entries := []IPAMAddress{
		{VNet: "sbaaav0", VMID: 101, IP: a("10.0.0.11")},
		{VNet: "sbaaav1", VMID: 101, IP: a("10.0.1.11")},
		{VNet: "sbaaav0", VMID: 102, IP: a("10.0.0.13")},
		{VNet: "sbaaav0", VMID: 102, IP: a("10.0.0.12")},
		{VNet: "sbbbbv0", VMID: 103, IP: a("10.0.0.99")}, // another sandbox's vnet
		{VNet: "sbaaav0", VMID: 0, IP: a("10.0.0.1")},    // the gateway
		{VNet: "sbaaav0", VMID: 103, IP: a("fd00::3")},
	}
	got := vmAddresses(nets, vms, entries, nil)
	want := [][]apitype.VMAddress{
		{{Network: "dmz", IPv4: "10.0.1.11"}, {Network: "lan", IPv4: "10.0.0.11"}},
		{{Network: "lan", IPv4: "10.0.0.12"}},
		nil,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("addresses %+v, want %+v", got, want)
	}
}

// TestVMAddressesTwoNICsOnOneNetwork: a VM with two NICs on one network
// has two IPAM entries there; each NIC gets the entry of its own MAC
// (from the VM's config: "virtio=MAC,..." or "macaddr=MAC"), in NIC
// order, whatever the addresses' order; without MACs the two NICs still
// show two addresses (review of issue 37: one address twice).
func TestVMAddressesTwoNICsOnOneNetwork(t *testing.T) {
	nets := []apitype.Network{{Name: "lan", VNet: "sbaaav0"}}
	vms := []apitype.VM{{Name: "router", VMID: 101, Networks: []string{"lan", "lan"}}}
	a := netip.MustParseAddr
	entries := []IPAMAddress{
		{VNet: "sbaaav0", VMID: 101, IP: a("10.0.0.11"), MAC: "bc:24:11:00:00:02"},
		{VNet: "sbaaav0", VMID: 101, IP: a("10.0.0.12"), MAC: "bc:24:11:00:00:01"},
	}
	cfg := map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=sbaaav0,firewall=0", "net1": "e1000,bridge=sbaaav0,macaddr=BC:24:11:00:00:02"}
	macs := map[int][]string{101: nicMACs(cfg, 2)}
	if want := []string{"bc:24:11:00:00:01", "bc:24:11:00:00:02"}; !reflect.DeepEqual(macs[101], want) {
		t.Fatalf("nicMACs %v, want %v", macs[101], want)
	}
	for _, tc := range []struct {
		name string
		macs map[int][]string
		want []apitype.VMAddress
	}{
		{"by MAC", macs, []apitype.VMAddress{{Network: "lan", IPv4: "10.0.0.12"}, {Network: "lan", IPv4: "10.0.0.11"}}},
		{"no MACs: distinct, lowest first", nil, []apitype.VMAddress{{Network: "lan", IPv4: "10.0.0.11"}, {Network: "lan", IPv4: "10.0.0.12"}}},
	} {
		if got := vmAddresses(nets, vms, entries, tc.macs); !reflect.DeepEqual(got, [][]apitype.VMAddress{tc.want}) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if !repeats([]string{"lan", "dmz", "lan"}) || repeats([]string{"lan", "dmz"}) {
		t.Error("repeats")
	}
}

// TestHostsBlock: a sibling is named by its address on the first network
// the guest shares with it; a VM without an address is left out, except
// the guest itself (127.0.1.1).
func TestHostsBlock(t *testing.T) {
	vms := []apitype.VM{
		{Name: "attacker", Networks: []string{"dmz", "lan"}, Addresses: []apitype.VMAddress{{Network: "dmz", IPv4: "10.0.1.11"}, {Network: "lan", IPv4: "10.0.0.11"}}},
		{Name: "target", Networks: []string{"lan"}, Addresses: []apitype.VMAddress{{Network: "lan", IPv4: "10.0.0.12"}}},
		{Name: "off", Networks: []string{"lan"}},
	}
	for _, tc := range []struct {
		self int
		want string
	}{
		{0, "10.0.1.11\tattacker\n10.0.0.12\ttarget\n"},
		{1, "10.0.0.11\tattacker\n10.0.0.12\ttarget\n"},
		{2, "10.0.0.11\tattacker\n10.0.0.12\ttarget\n127.0.1.1\toff\n"},
	} {
		want := hostsBegin + "\n" + tc.want + hostsEnd + "\n"
		if got := string(hostsBlock(vms, tc.self)); got != want {
			t.Errorf("block of %s:\n%s\nwant\n%s", vms[tc.self].Name, got, want)
		}
	}
}

// scriptedGuest answers the naming exec with res (or err) and records
// what is written.
type scriptedGuest struct {
	res    *apitype.ExecResult
	err    error
	argv   []string
	limit  int64
	writes map[string][]byte
}

func (g *scriptedGuest) Ping(context.Context) error { return nil }
func (g *scriptedGuest) Exec(_ context.Context, r GuestExec) (*apitype.ExecResult, error) {
	g.argv, g.limit = r.Argv, r.OutputLimit
	return g.res, g.err
}
func (g *scriptedGuest) ExecStream(context.Context, GuestExec, io.Writer, io.Writer) (*apitype.ExecResult, error) {
	return nil, errors.New("not used")
}
func (g *scriptedGuest) WriteFile(_ context.Context, p string, r io.Reader, _ os.FileMode) error {
	b, err := io.ReadAll(r)
	g.writes[p] = b
	return err
}
func (g *scriptedGuest) ReadFile(context.Context, string, io.Writer, int64) (int64, error) {
	return 0, errors.New("not used")
}

// TestNameGuestHostileHosts: what the guest's /etc/hosts is decides only
// whether its lines are kept: a symlink (exit 3), a missing or odd file
// (4), a file larger than maxHostsFile (truncated output) or a failed read
// get a fresh file; never an error, never more read than maxHostsFile+1.
// A hostname the guest refuses (5) fails the naming.
func TestNameGuestHostileHosts(t *testing.T) {
	block := hostsBlock([]apitype.VM{{Name: "target", Addresses: []apitype.VMAddress{{Network: "n", IPv4: "10.0.0.12"}}}}, 0)
	fresh := string(block) + hostsBase
	big := bytes.Repeat([]byte("x"), maxHostsFile+1)
	for _, tc := range []struct {
		name    string
		res     *apitype.ExecResult
		want    string
		wantErr string
	}{
		{"a regular file is kept", &apitype.ExecResult{Stdout: []byte("192.0.2.1 db\n")}, string(block) + "192.0.2.1 db\n", ""},
		{"a symlink", &apitype.ExecResult{ExitCode: 3}, fresh, ""},
		{"missing or not a regular file", &apitype.ExecResult{ExitCode: 4}, fresh, ""},
		{"too large", &apitype.ExecResult{Stdout: big[:maxHostsFile+1]}, fresh, ""},
		{"truncated by the agent", &apitype.ExecResult{Stdout: big[:10], StdoutTruncated: true}, fresh, ""},
		{"head failed", &apitype.ExecResult{ExitCode: 1, Stdout: []byte("half")}, fresh, ""},
		{"hostname refused", &apitype.ExecResult{ExitCode: 5}, "", "set hostname target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &scriptedGuest{res: tc.res, writes: map[string][]byte{}}
			m := &Engine{o: Options{QGADir: "/run/qga", Guests: func(string) Guest { return g }}}
			err := m.nameGuest(context.Background(), 101, "target", block)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || len(g.writes) != 0 {
					t.Fatalf("err %v, writes %d: want %q and nothing written", err, len(g.writes), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := string(g.writes["/etc/hosts"]); got != tc.want {
				t.Errorf("/etc/hosts:\n%q\nwant\n%q", got, tc.want)
			}
			if got := string(g.writes["/etc/hostname"]); got != "target\n" {
				t.Errorf("/etc/hostname %q", got)
			}
			if g.limit != maxHostsFile+1 || g.argv[len(g.argv)-1] != "65537" || g.argv[len(g.argv)-2] != "target" {
				t.Errorf("exec argv %q limit %d: want the name and a read bound of %d", g.argv[3:], g.limit, maxHostsFile+1)
			}
		})
	}
}
