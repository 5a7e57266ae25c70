package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// The state file (<StateDir>/sandboxes.json) has types of its own, so the
// API's Sandbox may change without changing what is on disk, and every
// format that was ever written stays readable:
//
//   - version 1 stored the API's Sandbox as it was then (stateV1 below
//     freezes that shape);
//   - version 2 stores savedSandbox, this package's own type;
//   - version 3 adds two optional fields to savedSandbox: pool (the entry
//     is a warm pool member, not a sandbox) and from_pool (a sandbox that
//     was claimed from the pool). Nothing else changed, so a version 2
//     file decodes as a version 3 file without them; a version 2 daemon
//     refuses a version 3 file rather than mistake members for sandboxes.
//     A VM of a version 3 file may also carry addresses (its IPAM
//     addresses, added later without a new version: a daemon that does
//     not know them drops them, and the API then shows none until the
//     sandbox's names are written again). A network may carry its DHCP
//     ranges the same way (dhcp_ranges, added later without a new
//     version: a daemon that does not know them drops them, and one that
//     reads a network of DHCP without them gives it its plan's range,
//     which is what the subnet had when an older daemon wrote the file;
//     a sandbox of custom ranges that went through an older daemon's
//     rewrite is then shown with the plan's range, its subnet unchanged).
//     The ranges read are not validated again: the file is the daemon's
//     own, and they are only shown.
//   - 4: a VM may carry kind ("lxc": a container). Nothing else changed,
//     so a version 2 or 3 file decodes as version 4 with no containers;
//     a version 3 daemon refuses a version 4 file rather than take a
//     container for a VM (its delete would ask for a VM of that id, find
//     none, and leave the container behind).
//   - 5: a VM may carry options (its per-VM options: firmware, cpu,
//     os_type, disk_controller, nic_controller). Nothing else changed, so
//     a version 2, 3 or 4 file decodes as version 5 with none; a version 4
//     daemon refuses a version 5 file rather than drop them, which would
//     silently lift a Windows VM's guard (GuestIO: exec and file calls
//     into it are refused) and make it look like a Linux VM.
//   - 6: a VM's options may carry no_agent (a VM created with agent
//     false). Nothing else changed, so a file of version 2 to 5 decodes
//     as version 6 with every VM's agent on; a version 5 daemon refuses a
//     version 6 file rather than drop it, which would have its health
//     monitor call the VM broken (agent-unresponsive) and its exec and
//     file calls wait for an agent that is not there.
//     A VM of a version 6 file may also carry no_network (a VM created
//     without any NIC: its networks empty, written as [] and never as
//     null), added later without a new version: a daemon that does not
//     know it drops it and still reads the VM's empty networks, which it
//     already takes as a VM on no network (no NIC to attach or check:
//     the containment check refuses it, nothing is configured again).
//     What it loses is said only: the answer's no_network, and its health
//     then names the taps missing. This daemon acts on the flag, and reads
//     a VM of networks [] as one of no_network also without it (after
//     such a daemon's rewrite): every VM created on a network has one in
//     its record.
//
// A new format adds a version, a frozen type for the old one and a case in
// decodeState; TestStateMigration keeps a file of every version.
const stateVersion = 6

// stateFile is the state file of version 6 (and 5, 4, 3, 2).
type stateFile struct {
	Version   int            `json:"version"`
	Node      string         `json:"node"`
	Sandboxes []savedSandbox `json:"sandboxes"`
}

// savedSandbox is one sandbox on disk (version 2).
type savedSandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Owner     string            `json:"owner,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Zone      string            `json:"zone"`
	Networks  []savedNetwork    `json:"networks"`
	VMs       []savedVM         `json:"vms"`
	Error     string            `json:"error,omitempty"`
	// FromPool: claimed from the warm pool (version 3).
	FromPool bool `json:"from_pool,omitempty"`
	// Pool is set on a warm pool member (version 3).
	Pool *savedPool `json:"pool,omitempty"`
}

// savedPool is what makes an entry a warm pool member (version 3).
type savedPool struct {
	Shape        string `json:"shape"`
	TemplateVMID int    `json:"template_vmid"`
}

// memberState is a warm pool member as the state file keeps it.
type memberState struct {
	Sandbox  apitype.Sandbox
	Shape    string
	Template int
}

// savedNetwork is one vnet of a sandbox on disk (version 2).
type savedNetwork struct {
	Name    string `json:"name"`
	VNet    string `json:"vnet"`
	CIDR    string `json:"cidr"`
	Gateway string `json:"gateway"`
	DHCP    bool   `json:"dhcp"`
	SNAT    bool   `json:"snat"`
	// DHCPRanges are the subnet's DHCP ranges (optional, see above).
	DHCPRanges []savedRange `json:"dhcp_ranges,omitempty"`
}

// savedRange is one DHCP range of a network on disk.
type savedRange struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// savedVM is one VM of a sandbox on disk (version 2).
type savedVM struct {
	Name string `json:"name"`
	// Kind is "lxc" for a container (version 4; absent: a VM).
	Kind      string   `json:"kind,omitempty"`
	VMID      int      `json:"vmid"`
	Template  string   `json:"template"`
	Cores     int      `json:"cores"`
	MemoryMiB int      `json:"memory_mib"`
	DiskGiB   int      `json:"disk_gib,omitempty"`
	Networks  []string `json:"networks"`
	// Addresses are the VM's IPAM addresses (optional, version 3).
	Addresses []savedAddress `json:"addresses,omitempty"`
	// NICs are the VM's NICs as the request's nics gave them, with the
	// MACs fixed (optional, version 3).
	NICs []savedNIC `json:"nics,omitempty"`
	// Options are the VM's per-VM options as the request gave them
	// (optional, version 5; absent in files of daemons before them: none).
	Options *savedOptions `json:"options,omitempty"`
	// NoNetwork: the VM was created without any NIC (optional, version
	// 6 as above; absent: a VM on its networks).
	NoNetwork bool `json:"no_network,omitempty"`
}

// savedOptions are a VM's firmware, CPU model, OS type, controllers and
// agent (apitype.VMRequest) on disk.
type savedOptions struct {
	Firmware       string `json:"firmware,omitempty"`
	CPU            string `json:"cpu,omitempty"`
	OSType         string `json:"os_type,omitempty"`
	DiskController string `json:"disk_controller,omitempty"`
	NICController  string `json:"nic_controller,omitempty"`
	// NoAgent: the VM was created with agent false (version 6).
	NoAgent bool `json:"no_agent,omitempty"`
}

// savedNIC is one NIC of a VM given by nics, on disk (version 3).
type savedNIC struct {
	Network string `json:"network"`
	// VNet is a shared vnet's id (Network empty); absent in files
	// written before shared vnets, which had none.
	VNet string `json:"vnet,omitempty"`
	MAC  string `json:"mac,omitempty"`
	IPv4 string `json:"ipv4,omitempty"`
}

// savedAddress is one IPAM address of a VM on disk (version 3).
type savedAddress struct {
	Network string `json:"network"`
	IPv4    string `json:"ipv4"`
}

// stateV1 is the state file of version 1: the API's Sandbox of that time,
// frozen here.
type stateV1 struct {
	Version   int    `json:"version"`
	Node      string `json:"node"`
	Sandboxes []struct {
		ID        string            `json:"id"`
		State     string            `json:"state"`
		Owner     string            `json:"owner"`
		Labels    map[string]string `json:"labels"`
		CreatedAt time.Time         `json:"created_at"`
		ExpiresAt time.Time         `json:"expires_at"`
		Zone      string            `json:"zone"`
		Networks  []struct {
			Name    string `json:"name"`
			VNet    string `json:"vnet"`
			CIDR    string `json:"cidr"`
			Gateway string `json:"gateway"`
			DHCP    bool   `json:"dhcp"`
			SNAT    bool   `json:"snat"`
		} `json:"networks"`
		VMs []struct {
			Name      string   `json:"name"`
			VMID      int      `json:"vmid"`
			Template  string   `json:"template"`
			Cores     int      `json:"cores"`
			MemoryMiB int      `json:"memory_mib"`
			DiskGiB   int      `json:"disk_gib"`
			Networks  []string `json:"networks"`
		} `json:"vms"`
		Error string `json:"error"`
	} `json:"sandboxes"`
}

// encodeState renders the sandboxes and warm pool members of node as the
// current format.
func encodeState(node string, sbs []apitype.Sandbox, members []memberState) ([]byte, error) {
	st := stateFile{Version: stateVersion, Node: node, Sandboxes: make([]savedSandbox, 0, len(sbs)+len(members))}
	for _, s := range sbs {
		st.Sandboxes = append(st.Sandboxes, toSaved(s))
	}
	for _, p := range members {
		v := toSaved(p.Sandbox)
		v.Pool = &savedPool{Shape: p.Shape, TemplateVMID: p.Template}
		st.Sandboxes = append(st.Sandboxes, v)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// toSaved is a sandbox as the current format stores it.
func toSaved(s apitype.Sandbox) savedSandbox {
	v := savedSandbox{ID: s.ID, State: s.State, Owner: s.Owner, Labels: s.Labels, CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt,
		Zone: s.Zone, Error: s.Error, FromPool: s.FromPool, Networks: make([]savedNetwork, len(s.Networks)), VMs: make([]savedVM, len(s.VMs))}
	for j, n := range s.Networks {
		v.Networks[j] = savedNetwork{Name: n.Name, VNet: n.VNet, CIDR: n.CIDR, Gateway: n.Gateway, DHCP: n.DHCP, SNAT: n.SNAT}
		for _, r := range n.DHCPRanges {
			v.Networks[j].DHCPRanges = append(v.Networks[j].DHCPRanges, savedRange(r))
		}
	}
	for j, m := range s.VMs {
		v.VMs[j] = savedVM{Name: m.Name, Kind: m.Kind, VMID: m.VMID, Template: m.Template, Cores: m.Cores, MemoryMiB: m.MemoryMiB,
			DiskGiB: m.DiskGiB, Networks: slices.Clone(m.Networks), NoNetwork: m.NoNetwork}
		if m.NoNetwork && v.VMs[j].Networks == nil {
			v.VMs[j].Networks = []string{} // [] on disk: an older daemon reads no null
		}
		for _, a := range m.Addresses {
			v.VMs[j].Addresses = append(v.VMs[j].Addresses, savedAddress(a))
		}
		for _, n := range m.NICs {
			v.VMs[j].NICs = append(v.VMs[j].NICs, savedNIC(n))
		}
		if o := (savedOptions{m.Firmware, m.CPU, m.OSType, m.DiskController, m.NICController, !m.HasAgent()}); o != (savedOptions{}) {
			v.VMs[j].Options = &o
		}
	}
	return v
}

// decodeState reads a state file of any version this daemon knows: the
// sandboxes, and the warm pool members (version 3).
func decodeState(b []byte) (node string, sbs []apitype.Sandbox, members []memberState, err error) {
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return "", nil, nil, err
	}
	switch {
	case head.Version == nil:
		return "", nil, nil, fmt.Errorf("no version")
	case *head.Version == 1:
		node, sbs, err := decodeV1(b)
		return node, sbs, nil, err
	case *head.Version >= 2 && *head.Version <= stateVersion:
	default:
		return "", nil, nil, fmt.Errorf("version %d is not one this daemon knows (it reads 1..%d): written by a newer pve-inspectd?", *head.Version, stateVersion)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return "", nil, nil, err
	}
	for _, v := range st.Sandboxes {
		s := apitype.Sandbox{ID: v.ID, State: v.State, Owner: v.Owner, Labels: v.Labels, CreatedAt: v.CreatedAt, ExpiresAt: v.ExpiresAt,
			Zone: v.Zone, Error: v.Error, FromPool: v.FromPool, Networks: make([]apitype.Network, len(v.Networks)), VMs: make([]apitype.VM, len(v.VMs))}
		for j, n := range v.Networks {
			s.Networks[j] = apitype.Network{Name: n.Name, VNet: n.VNet, CIDR: n.CIDR, Gateway: n.Gateway, DHCP: n.DHCP, SNAT: n.SNAT}
			for _, r := range n.DHCPRanges {
				s.Networks[j].DHCPRanges = append(s.Networks[j].DHCPRanges, apitype.DHCPRange(r))
			}
			s.Networks[j] = withPlanRanges(s.Networks[j])
		}
		for j, m := range v.VMs {
			// networks [] is a VM of no_network also without the flag,
			// which an older daemon's rewrite drops: a VM on a network
			// always has one in its record (the API's create fills in
			// the first network)
			noNet := m.NoNetwork || (m.Networks != nil && len(m.Networks) == 0)
			s.VMs[j] = apitype.VM{Name: m.Name, Kind: m.Kind, VMID: m.VMID, Template: m.Template, Cores: m.Cores, MemoryMiB: m.MemoryMiB,
				DiskGiB: m.DiskGiB, Networks: m.Networks, NoNetwork: noNet}
			if noNet && s.VMs[j].Networks == nil {
				s.VMs[j].Networks = []string{} // the answer's "networks": [], never null
			}
			for _, a := range m.Addresses {
				s.VMs[j].Addresses = append(s.VMs[j].Addresses, apitype.VMAddress(a))
			}
			for _, n := range m.NICs {
				s.VMs[j].NICs = append(s.VMs[j].NICs, apitype.NIC(n))
			}
			if o := m.Options; o != nil {
				s.VMs[j].Firmware, s.VMs[j].CPU, s.VMs[j].OSType, s.VMs[j].DiskController, s.VMs[j].NICController = o.Firmware, o.CPU, o.OSType, o.DiskController, o.NICController
				s.VMs[j].Agent = noAgentFlag(!o.NoAgent)
			}
		}
		if v.Pool != nil {
			members = append(members, memberState{Sandbox: s, Shape: v.Pool.Shape, Template: v.Pool.TemplateVMID})
			continue
		}
		sbs = append(sbs, s)
	}
	return st.Node, sbs, members, nil
}

// decodeV1 migrates a version 1 file.
func decodeV1(b []byte) (string, []apitype.Sandbox, error) {
	var st stateV1
	if err := json.Unmarshal(b, &st); err != nil {
		return "", nil, err
	}
	var sbs []apitype.Sandbox
	for _, v := range st.Sandboxes {
		s := apitype.Sandbox{ID: v.ID, State: v.State, Owner: v.Owner, Labels: v.Labels, CreatedAt: v.CreatedAt, ExpiresAt: v.ExpiresAt,
			Zone: v.Zone, Error: v.Error, Networks: make([]apitype.Network, len(v.Networks)), VMs: make([]apitype.VM, len(v.VMs))}
		for j, n := range v.Networks {
			s.Networks[j] = withPlanRanges(apitype.Network{Name: n.Name, VNet: n.VNet, CIDR: n.CIDR, Gateway: n.Gateway, DHCP: n.DHCP, SNAT: n.SNAT})
		}
		for j, m := range v.VMs {
			s.VMs[j] = apitype.VM{Name: m.Name, VMID: m.VMID, Template: m.Template, Cores: m.Cores, MemoryMiB: m.MemoryMiB,
				DiskGiB: m.DiskGiB, Networks: m.Networks}
		}
		sbs = append(sbs, s)
	}
	return st.Node, sbs, nil
}

const stateName = "sandboxes.json"

// saveState writes every sandbox to <StateDir>/sandboxes.json atomically.
func (m *Engine) saveState() error {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	b, err := encodeState(m.o.Node, m.List(), m.memberStates())
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := os.MkdirAll(m.o.StateDir, 0o700); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(m.o.StateDir, stateName), b, 0o600); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// memberStates returns a copy of every warm pool member, by id.
func (m *Engine) memberStates() []memberState {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]memberState, 0, len(m.members))
	for _, r := range m.members {
		out = append(out, memberState{Sandbox: cloneSandbox(r.Sandbox), Shape: r.member.shape, Template: r.member.template})
	}
	slices.SortFunc(out, func(a, b memberState) int { return strings.Compare(a.Sandbox.ID, b.Sandbox.ID) })
	return out
}

// loadState reads the state file; a missing file is an empty state.
func (m *Engine) loadState() ([]apitype.Sandbox, []memberState, error) {
	b, err := os.ReadFile(filepath.Join(m.o.StateDir, stateName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("load state: %w", err)
	}
	node, sbs, members, err := decodeState(b)
	if err != nil {
		return nil, nil, fmt.Errorf("load state %s: %w", filepath.Join(m.o.StateDir, stateName), err)
	}
	if node != "" && node != m.o.Node {
		return nil, nil, fmt.Errorf("load state: file belongs to node %q, this node is %q", node, m.o.Node)
	}
	seen := map[string]bool{}
	for _, s := range sbs {
		if !reSandbox.MatchString(s.ID) {
			return nil, nil, fmt.Errorf("load state: bad sandbox id %q", s.ID)
		}
		seen[s.ID] = true
	}
	for _, p := range members {
		if !reSandbox.MatchString(p.Sandbox.ID) || seen[p.Sandbox.ID] {
			return nil, nil, fmt.Errorf("load state: bad or repeated pool member id %q", p.Sandbox.ID)
		}
		seen[p.Sandbox.ID] = true
	}
	return sbs, members, nil
}
