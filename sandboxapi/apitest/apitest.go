// Package apitest holds in-memory fakes of the sandbox engine's Proxmox and
// guest agent sides, for tests of the API, its client and the CLI. They keep
// Proxmox's observable rules that the API relies on (ids unique, clone of a
// template only, tags as set, zone deletion only when empty, pending SDN
// until apply) and count every call.
package apitest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// FakeVM is a VM in the fake Proxmox.
type FakeVM struct {
	Info      sandbox.VMInfo
	Config    sandbox.VMConfig
	DiskGiB   int
	Snapshots map[string]map[string][]byte
	// QMPStatus is QEMU's run state (SetVMState; "" follows Info.Status).
	QMPStatus string
}

// Proxmox is an in-memory Proxmox.
type Proxmox struct {
	mu      sync.Mutex
	VMs     map[int]*FakeVM
	Zones   map[string]bool
	VNets   map[string]sandbox.VNetInfo
	Subnets map[string][]string
	Pools   map[string]bool
	// Applied counts SDN applies; Pending is true when changes await one.
	Applied  int
	Pending  bool
	Calls    map[string]int
	failOnce map[string]error
	applied  map[string]bool
	// FailOn makes the named operation (e.g. "StartVM") fail with the error.
	FailOn map[string]error
	next   int
	// trace is every operation called, in order (CallTrace).
	trace []string
	// reserved are the IPAM entries ReserveIP added, by vnet; released the
	// NICs' own addresses ReleaseIP removed, as "vnet vmid".
	reserved map[string][]sandbox.IPAMAddress
	released map[string]bool
	// Guests receives VM starts/stops so agents come up and go down.
	Guests *Guests
	// zoneTypes are the zones' types other than "simple" (SetZoneType).
	zoneTypes map[string]string
}

// NewProxmox returns a fake with the given templates (name -> vmid).
func NewProxmox(g *Guests, templates map[string]int) *Proxmox {
	p := &Proxmox{VMs: map[int]*FakeVM{}, Zones: map[string]bool{}, VNets: map[string]sandbox.VNetInfo{},
		Subnets: map[string][]string{}, Pools: map[string]bool{}, Calls: map[string]int{}, FailOn: map[string]error{}, next: 100, Guests: g,
		reserved: map[string][]sandbox.IPAMAddress{}, released: map[string]bool{}}
	for name, id := range templates {
		p.VMs[id] = &FakeVM{Info: sandbox.VMInfo{VMID: id, Name: name, Status: "stopped", Template: true}}
	}
	return p
}

func (p *Proxmox) call(op string) error {
	p.Calls[op]++
	p.trace = append(p.trace, op)
	if err, ok := p.FailOn[op]; ok {
		return err
	}
	if err, ok := p.failOnce[op]; ok {
		delete(p.failOnce, op)
		return err
	}
	return nil
}

// CallTrace returns the operations called so far, in order.
func (p *Proxmox) CallTrace() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.trace)
}

// CallCount returns the number of calls of every operation together.
func (p *Proxmox) CallCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.Calls {
		n += c
	}
	return n
}

// Mutations counts the calls that change something.
func (p *Proxmox) Mutations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for op, c := range p.Calls {
		switch op {
		case "NextID", "TemplateID", "VM", "VMStatus", "ListVMs", "ListVNets", "ListSubnetCIDRs", "VNetSubnets", "IPAMAddresses", "MACEntries":
		default:
			n += c
		}
	}
	return n
}

// Fail sets (err != nil) or clears a failure.
func (p *Proxmox) Fail(op string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.FailOn, op)
	} else {
		p.FailOn[op] = err
	}
}

// FailOnce makes the next call of op fail with err.
func (p *Proxmox) FailOnce(op string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failOnce == nil {
		p.failOnce = map[string]error{}
	}
	p.failOnce[op] = err
}

// AddVM adds a VM directly (e.g. a foreign or orphaned one).
func (p *Proxmox) AddVM(info sandbox.VMInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.VMs[info.VMID] = &FakeVM{Info: info, Snapshots: map[string]map[string][]byte{}}
	if info.Status == "running" && p.Guests != nil {
		p.Guests.up(info.VMID)
	}
}

// AddVNet adds a vnet (with its zone and subnet) directly.
func (p *Proxmox) AddVNet(v sandbox.VNetInfo, cidr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Zones[v.Zone] = true
	p.VNets[v.ID] = v
	if cidr != "" {
		p.Subnets[v.ID] = append(p.Subnets[v.ID], cidr)
	}
}

// VMIDs returns the ids of non-template VMs.
func (p *Proxmox) VMIDs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for id, v := range p.VMs {
		if !v.Info.Template {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// SDNObjects returns the number of zones, vnets and subnets.
func (p *Proxmox) SDNObjects() (zones, vnets, subnets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.Subnets {
		subnets += len(s)
	}
	return len(p.Zones), len(p.VNets), subnets
}

// VMByID returns a copy of a VM.
func (p *Proxmox) VMByID(id int) (FakeVM, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.VMs[id]
	if !ok {
		return FakeVM{}, false
	}
	return *v, true
}

// NextID implements sandbox.Proxmox.
func (p *Proxmox) NextID(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("NextID"); err != nil {
		return 0, err
	}
	id := p.next
	for p.VMs[id] != nil {
		id++
	}
	return id, nil
}

// TemplateID implements sandbox.Proxmox.
func (p *Proxmox) TemplateID(ctx context.Context, name string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("TemplateID"); err != nil {
		return 0, err
	}
	for id, v := range p.VMs {
		if v.Info.Template && v.Info.Name == name && v.Info.Kind == "" {
			return id, nil
		}
	}
	return 0, fmt.Errorf("template %q: %w", name, sandbox.ErrNotFound)
}

// CloneVM implements sandbox.Proxmox.
func (p *Proxmox) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("CloneVM"); err != nil {
		return err
	}
	t, ok := p.VMs[s.Template]
	if !ok || !t.Info.Template || t.Info.Kind != "" {
		return fmt.Errorf("clone: template %d: %w", s.Template, sandbox.ErrNotFound)
	}
	if p.VMs[s.NewID] != nil {
		return fmt.Errorf("clone: vm %d: %w", s.NewID, sandbox.ErrExists)
	}
	if s.Pool != "" && !p.Pools[s.Pool] {
		return fmt.Errorf("clone: pool %q does not exist", s.Pool)
	}
	p.VMs[s.NewID] = &FakeVM{Info: sandbox.VMInfo{VMID: s.NewID, Name: s.Name, Status: "stopped", Pool: s.Pool, Tags: slices.Clone(t.Info.Tags)},
		Snapshots: map[string]map[string][]byte{}}
	return nil
}

func (p *Proxmox) vm(id int) (*FakeVM, error) {
	v, ok := p.VMs[id]
	if !ok || v.Info.Kind != "" { // a container is not a VM (CTs)
		return nil, fmt.Errorf("vm %d: %w", id, sandbox.ErrNotFound)
	}
	return v, nil
}

// ConfigureVM implements sandbox.Proxmox.
func (p *Proxmox) ConfigureVM(ctx context.Context, id int, c sandbox.VMConfig) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ConfigureVM"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	for _, b := range c.Bridges {
		if _, ok := p.VNets[b]; !ok {
			return fmt.Errorf("configure: bridge %q does not exist", b)
		}
	}
	v.Config = c
	v.Info.Tags = slices.Clone(c.Tags)
	return nil
}

// IPAMAddresses implements sandbox.Proxmox: each NIC of a VM on a wanted
// vnet has the address 10+(vmid-100)%240 past the start of the vnet's
// first subnet, or the next one ReserveIP did not take (as Proxmox's
// IPAM, one per NIC, distinct within a sandbox), with the NIC's MAC when
// ConfigureVM gave one, unless ReleaseIP removed it; and the entries of
// ReserveIP, which name no VM.
func (p *Proxmox) IPAMAddresses(ctx context.Context, vnets []string) ([]sandbox.IPAMAddress, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("IPAMAddresses"); err != nil {
		return nil, err
	}
	return p.ipamLocked(func(vnet string) bool { return slices.Contains(vnets, vnet) }), nil
}

// MACEntries implements sandbox.Proxmox: the entries IPAMAddresses would
// list on any vnet whose MAC is one of macs (in any case).
func (p *Proxmox) MACEntries(ctx context.Context, macs []string) ([]sandbox.IPAMAddress, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("MACEntries"); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(p.ipamLocked(func(string) bool { return true }), func(e sandbox.IPAMAddress) bool {
		return e.MAC == "" || !slices.ContainsFunc(macs, func(m string) bool { return strings.EqualFold(m, e.MAC) })
	}), nil
}

// ipamLocked lists the IPAM entries of the vnets want takes.
func (p *Proxmox) ipamLocked(want func(vnet string) bool) []sandbox.IPAMAddress {
	var out []sandbox.IPAMAddress
	for id, v := range p.VMs {
		for k, b := range v.Config.Bridges {
			if !want(b) {
				continue
			}
			ip, ok := p.nicAddrLocked(id, b)
			if !ok || p.released[fmt.Sprint(b, " ", id)] {
				continue
			}
			e := sandbox.IPAMAddress{VNet: b, VMID: id, IP: ip}
			if k < len(v.Config.MACs) {
				e.MAC = strings.ToLower(v.Config.MACs[k])
			}
			out = append(out, e)
		}
	}
	for _, b := range slices.Sorted(maps.Keys(p.reserved)) {
		if want(b) {
			out = append(out, p.reserved[b]...)
		}
	}
	return out
}

// nicAddrLocked is the range address of VM id's NIC on vnet b.
func (p *Proxmox) nicAddrLocked(id int, b string) (netip.Addr, bool) {
	if len(p.Subnets[b]) == 0 {
		return netip.Addr{}, false
	}
	pfx, err := netip.ParsePrefix(p.Subnets[b][0])
	if err != nil {
		return netip.Addr{}, false
	}
	ip := pfx.Masked().Addr()
	for range 10 + (id-100)%240 {
		ip = ip.Next()
	}
	for slices.ContainsFunc(p.reserved[b], func(e sandbox.IPAMAddress) bool { return e.IP == ip }) {
		ip = ip.Next()
	}
	return ip, true
}

// ReserveIP implements sandbox.Proxmox: an entry of ip for mac naming no
// VM; an ip reserved already is refused, as Proxmox's IPAM does.
func (p *Proxmox) ReserveIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ReserveIP"); err != nil {
		return err
	}
	if v, ok := p.VNets[vnet]; !ok || v.Zone != zone || len(p.Subnets[vnet]) == 0 {
		return fmt.Errorf("reserve %s: no subnet of vnet %s in zone %s", ip, vnet, zone)
	}
	if slices.ContainsFunc(p.reserved[vnet], func(e sandbox.IPAMAddress) bool { return e.IP == ip }) {
		return fmt.Errorf("IP '%s' already exist", ip)
	}
	p.reserved[vnet] = append(p.reserved[vnet], sandbox.IPAMAddress{VNet: vnet, IP: ip, MAC: strings.ToLower(mac)})
	return nil
}

// ReleaseIP implements sandbox.Proxmox: a reserved entry goes, or the
// range address of the NIC of MAC mac on vnet (listed no more).
func (p *Proxmox) ReleaseIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ReleaseIP"); err != nil {
		return err
	}
	if i := slices.IndexFunc(p.reserved[vnet], func(e sandbox.IPAMAddress) bool { return e.IP == ip }); i >= 0 {
		p.reserved[vnet] = slices.Delete(p.reserved[vnet], i, i+1)
		return nil
	}
	for id, v := range p.VMs {
		k := slices.Index(v.Config.Bridges, vnet)
		if got, ok := p.nicAddrLocked(id, vnet); ok && k >= 0 && got == ip && k < len(v.Config.MACs) && strings.EqualFold(v.Config.MACs[k], mac) &&
			!p.released[fmt.Sprint(vnet, " ", id)] {
			p.released[fmt.Sprint(vnet, " ", id)] = true
			return nil
		}
	}
	return fmt.Errorf("IP '%s' does not exist in IPAM DB: %w", ip, sandbox.ErrNotFound)
}

// Reserved lists the entries ReserveIP added that are left, on every
// vnet.
func (p *Proxmox) Reserved() []sandbox.IPAMAddress {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []sandbox.IPAMAddress
	for _, es := range p.reserved {
		out = append(out, es...)
	}
	return out
}

// SetVMTags implements sandbox.Proxmox.
func (p *Proxmox) SetVMTags(ctx context.Context, id int, name string, tags []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("SetVMTags"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	v.Info.Name = name
	v.Info.Tags = slices.Clone(tags)
	v.Config.Tags = slices.Clone(tags)
	return nil
}

// ResizeDisk implements sandbox.Proxmox.
func (p *Proxmox) ResizeDisk(ctx context.Context, id int, size int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ResizeDisk"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	v.DiskGiB = size
	return nil
}

// StartVM implements sandbox.Proxmox: the VM runs, and its agent answers
// unless ConfigureVM turned it off.
func (p *Proxmox) StartVM(ctx context.Context, id int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("StartVM"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	for _, b := range v.Config.Bridges {
		if !p.applied[b] {
			return fmt.Errorf("start vm %d: bridge %q does not exist (SDN not applied)", id, b)
		}
	}
	v.Info.Status = "running"
	if p.Guests != nil && !v.Config.NoAgent {
		// a VM configured without its agent device has none
		// (VMConfig.NoAgent: agent 0)
		p.Guests.up(id)
	}
	return nil
}

// StopVM implements sandbox.Proxmox.
func (p *Proxmox) StopVM(ctx context.Context, id int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("StopVM"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	v.Info.Status = "stopped"
	if p.Guests != nil {
		p.Guests.down(id)
	}
	return nil
}

// DeleteVM implements sandbox.Proxmox.
func (p *Proxmox) DeleteVM(ctx context.Context, id int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("DeleteVM"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	if v.Info.Status == "running" {
		return fmt.Errorf("delete vm %d: VM is running", id)
	}
	// the NICs' IPAM entries go, found by their MACs (qemu-server
	// delete_ifaces_ipams_ips)
	for k, b := range v.Config.Bridges {
		delete(p.released, fmt.Sprint(b, " ", id))
		if k < len(v.Config.MACs) && v.Config.MACs[k] != "" {
			p.reserved[b] = slices.DeleteFunc(p.reserved[b], func(e sandbox.IPAMAddress) bool { return strings.EqualFold(e.MAC, v.Config.MACs[k]) })
		}
	}
	delete(p.VMs, id)
	if p.Guests != nil {
		p.Guests.remove(id)
	}
	return nil
}

// VM implements sandbox.Proxmox.
func (p *Proxmox) VM(ctx context.Context, id int) (sandbox.VMInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("VM"); err != nil {
		return sandbox.VMInfo{}, err
	}
	v, err := p.vm(id)
	if err != nil {
		return sandbox.VMInfo{}, err
	}
	info := v.Info
	info.Tags = slices.Clone(info.Tags)
	return info, nil
}

// ListVMs implements sandbox.Proxmox.
func (p *Proxmox) ListVMs(ctx context.Context) ([]sandbox.VMInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ListVMs"); err != nil {
		return nil, err
	}
	var out []sandbox.VMInfo
	for _, v := range p.VMs {
		if v.Info.Kind != "" {
			continue
		}
		info := v.Info
		info.Tags = slices.Clone(info.Tags)
		out = append(out, info)
	}
	return out, nil
}

// Snapshot implements sandbox.Proxmox: it copies the guest's files.
func (p *Proxmox) Snapshot(ctx context.Context, id int, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("Snapshot"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	if _, ok := v.Snapshots[name]; ok {
		return fmt.Errorf("snapshot %q: %w", name, sandbox.ErrExists)
	}
	v.Snapshots[name] = p.Guests.files(id)
	return nil
}

// Rollback implements sandbox.Proxmox: it restores the guest's files and
// leaves the VM stopped, as a rollback to a disk-only snapshot does.
func (p *Proxmox) Rollback(ctx context.Context, id int, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("Rollback"); err != nil {
		return err
	}
	v, err := p.vm(id)
	if err != nil {
		return err
	}
	snap, ok := v.Snapshots[name]
	if !ok {
		return fmt.Errorf("snapshot %q: %w", name, sandbox.ErrNotFound)
	}
	p.Guests.setFiles(id, snap)
	v.Info.Status = "stopped"
	p.Guests.down(id)
	return nil
}

// CreateZone implements sandbox.Proxmox.
func (p *Proxmox) CreateZone(ctx context.Context, z sandbox.ZoneSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("CreateZone"); err != nil {
		return err
	}
	if len(z.ID) > 8 || p.Zones[z.ID] {
		return fmt.Errorf("zone %q: invalid or %w", z.ID, sandbox.ErrExists)
	}
	p.Zones[z.ID] = true
	p.Pending = true
	return nil
}

// SetZoneType makes zone id one of type typ (an operator's VLAN zone, say);
// a zone is "simple" otherwise, as the daemon makes them.
func (p *Proxmox) SetZoneType(id, typ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.zoneTypes == nil {
		p.zoneTypes = map[string]string{}
	}
	p.zoneTypes[id] = typ
}

// DeleteZone implements sandbox.Proxmox.
func (p *Proxmox) DeleteZone(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("DeleteZone"); err != nil {
		return err
	}
	if !p.Zones[id] {
		return fmt.Errorf("zone %q: %w", id, sandbox.ErrNotFound)
	}
	for _, v := range p.VNets {
		if v.Zone == id {
			return fmt.Errorf("zone %q is used by vnet %s", id, v.ID)
		}
	}
	delete(p.Zones, id)
	p.Pending = true
	return nil
}

// CreateVNet implements sandbox.Proxmox.
func (p *Proxmox) CreateVNet(ctx context.Context, v sandbox.VNetSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("CreateVNet"); err != nil {
		return err
	}
	if !p.Zones[v.Zone] {
		return fmt.Errorf("vnet %s: zone %q: %w", v.ID, v.Zone, sandbox.ErrNotFound)
	}
	if _, ok := p.VNets[v.ID]; ok || len(v.ID) > 8 {
		return fmt.Errorf("vnet %q: invalid or %w", v.ID, sandbox.ErrExists)
	}
	p.VNets[v.ID] = sandbox.VNetInfo(v)
	p.Pending = true
	return nil
}

// DeleteVNet implements sandbox.Proxmox.
func (p *Proxmox) DeleteVNet(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("DeleteVNet"); err != nil {
		return err
	}
	if _, ok := p.VNets[id]; !ok {
		return fmt.Errorf("vnet %q: %w", id, sandbox.ErrNotFound)
	}
	if len(p.Subnets[id]) > 0 {
		return fmt.Errorf("vnet %q has subnets", id)
	}
	delete(p.VNets, id)
	delete(p.Subnets, id)
	p.Pending = true
	return nil
}

// CreateSubnet implements sandbox.Proxmox.
func (p *Proxmox) CreateSubnet(ctx context.Context, s sandbox.SubnetSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("CreateSubnet"); err != nil {
		return err
	}
	if _, ok := p.VNets[s.VNet]; !ok {
		return fmt.Errorf("subnet: vnet %q: %w", s.VNet, sandbox.ErrNotFound)
	}
	p.Subnets[s.VNet] = append(p.Subnets[s.VNet], s.CIDR)
	p.Pending = true
	return nil
}

// DeleteSubnet implements sandbox.Proxmox.
func (p *Proxmox) DeleteSubnet(ctx context.Context, vnet, cidr string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("DeleteSubnet"); err != nil {
		return err
	}
	i := slices.Index(p.Subnets[vnet], cidr)
	if i < 0 {
		return fmt.Errorf("subnet %s: %w", cidr, sandbox.ErrNotFound)
	}
	p.Subnets[vnet] = slices.Delete(p.Subnets[vnet], i, i+1)
	delete(p.reserved, vnet) // the client deletes the vnet's IPAM entries first
	p.Pending = true
	return nil
}

// ListVNets implements sandbox.Proxmox.
func (p *Proxmox) ListVNets(ctx context.Context) ([]sandbox.VNetInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ListVNets"); err != nil {
		return nil, err
	}
	return slices.Collect(maps.Values(p.VNets)), nil
}

// ZoneType implements sandbox's ZoneTyper: "simple" unless SetZoneType
// said otherwise.
func (p *Proxmox) ZoneType(ctx context.Context, id string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ZoneType"); err != nil {
		return "", err
	}
	if !p.Zones[id] {
		return "", fmt.Errorf("zone %s: %w", id, sandbox.ErrNotFound)
	}
	if t, ok := p.zoneTypes[id]; ok {
		return t, nil
	}
	return "simple", nil
}

// ListSubnetCIDRs lists the CIDRs of every subnet (for tests).
func (p *Proxmox) ListSubnetCIDRs(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ListSubnetCIDRs"); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range p.Subnets {
		out = append(out, s...)
	}
	return out, nil
}

// VNetSubnets implements sandbox.Proxmox.
func (p *Proxmox) VNetSubnets(ctx context.Context, vnet string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("VNetSubnets"); err != nil {
		return nil, err
	}
	return slices.Clone(p.Subnets[vnet]), nil
}

// ApplySDN implements sandbox.Proxmox.
func (p *Proxmox) ApplySDN(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("ApplySDN"); err != nil {
		return err
	}
	p.Applied++
	p.Pending = false
	p.applied = map[string]bool{}
	for id := range p.VNets {
		p.applied[id] = true
	}
	return nil
}

// EnsurePool implements sandbox.Proxmox.
func (p *Proxmox) EnsurePool(ctx context.Context, pool string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("EnsurePool"); err != nil {
		return err
	}
	p.Pools[pool] = true
	return nil
}

// Guests is a registry of fake guest agents keyed by VM id; its Dial is a
// sandbox.GuestDialer.
type Guests struct {
	mu     sync.Mutex
	agents map[int]*Guest
	// PingFails makes the agent of these VMs never answer.
	PingFails map[int]bool
	// blocking counts the "block" commands running.
	blocking atomic.Int64
}

// Blocking returns how many "block" commands run now (each runs until its
// call ends).
func (g *Guests) Blocking() int { return int(g.blocking.Load()) }

// NewGuests returns an empty registry.
func NewGuests() *Guests { return &Guests{agents: map[int]*Guest{}, PingFails: map[int]bool{}} }

func (g *Guests) agent(id int) *Guest {
	a, ok := g.agents[id]
	if !ok {
		a = &Guest{id: id, reg: g, fs: map[string][]byte{}}
		g.agents[id] = a
	}
	return a
}

func (g *Guests) up(id int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.agent(id).running = true
}

func (g *Guests) down(id int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.agent(id).running = false
}

func (g *Guests) remove(id int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.agents, id)
}

func (g *Guests) files(id int) map[string][]byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.agent(id).fs)
}

func (g *Guests) setFiles(id int, fs map[string][]byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.agent(id).fs = maps.Clone(fs)
}

// Dial returns the guest behind <dir>/<vmid>.qga.
func (g *Guests) Dial(socket string) sandbox.Guest {
	id, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(socket), ".qga"))
	if err != nil {
		id = -1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.agent(id)
}

// Guest is one fake agent with an in-memory file system. Exec knows a few
// programs: echo ARGS, cat PATH, uname [-a], fail CODE, stream N (N chunks
// alternating stdout/stderr), sleep (killed by its timeout), hang (the agent
// stops answering: ErrGuestTimeout), and the daemon's naming script
// (/bin/sh -c SCRIPT pve-inspect-names NAME LIMIT).
type Guest struct {
	id      int
	reg     *Guests
	running bool
	fs      map[string][]byte
	// hostname is what the naming script set (Hostname).
	hostname string
}

// Hostname is the hostname the daemon set in VM id's guest ("" when none).
func (g *Guests) Hostname(id int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.agent(id).hostname
}

// File is the content of path in VM id's guest (ok false when absent).
func (g *Guests) File(id int, path string) (b []byte, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok = g.agent(id).fs[path]
	return slices.Clone(b), ok
}

func (a *Guest) alive() error {
	a.reg.mu.Lock()
	defer a.reg.mu.Unlock()
	if !a.running || a.reg.PingFails[a.id] {
		return fmt.Errorf("vm %d: %w", a.id, sandbox.ErrGuestUnavailable)
	}
	return nil
}

// Ping implements sandbox.Guest.
func (a *Guest) Ping(ctx context.Context) error { return a.alive() }

// Exec implements sandbox.Guest.
func (a *Guest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	var out, errb bytes.Buffer
	res, err := a.ExecStream(ctx, r, &out, &errb)
	if err != nil {
		return nil, err
	}
	res.Stdout, res.Stderr = out.Bytes(), errb.Bytes()
	if r.OutputLimit > 0 && int64(len(res.Stdout)) > r.OutputLimit {
		res.Stdout, res.StdoutTruncated = res.Stdout[:r.OutputLimit], true
	}
	if res.Stdout == nil {
		res.Stdout = []byte{}
	}
	if res.Stderr == nil {
		res.Stderr = []byte{}
	}
	return res, nil
}

// ExecStream implements sandbox.Guest.
func (a *Guest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	if err := a.alive(); err != nil {
		return nil, err
	}
	res := &apitype.ExecResult{}
	switch r.Argv[0] {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(r.Argv[1:], " "))
	case "uname":
		fmt.Fprintf(stdout, "Linux fake-%d 6.14.0 #1 SMP x86_64 GNU/Linux\n", a.id)
	case "cat":
		if len(r.Stdin) > 0 && len(r.Argv) == 1 {
			_, _ = stdout.Write(r.Stdin)
			break
		}
		a.reg.mu.Lock()
		b, ok := a.fs[r.Argv[1]]
		a.reg.mu.Unlock()
		if !ok {
			fmt.Fprintf(stderr, "cat: %s: No such file or directory\n", r.Argv[1])
			res.ExitCode = 1
			break
		}
		_, _ = stdout.Write(b)
	case "fail":
		res.ExitCode, _ = strconv.Atoi(r.Argv[1])
		fmt.Fprintln(stderr, "failing")
	case "stream":
		n, _ := strconv.Atoi(r.Argv[1])
		for i := 0; i < n; i++ {
			if i%2 == 0 {
				fmt.Fprintf(stdout, "out %d\n", i)
			} else {
				fmt.Fprintf(stderr, "err %d\n", i)
			}
		}
	case "sleep":
		// killed by its timeout
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(r.Timeout) * time.Second):
		}
		res.ExitCode, res.TimedOut = -1, true
	case "block":
		// runs until the call ends (a delete ends it); Blocking counts it
		a.reg.blocking.Add(1)
		defer a.reg.blocking.Add(-1)
		<-ctx.Done()
		return nil, ctx.Err()
	case "hang":
		// an agent that stops answering
		return nil, fmt.Errorf("exec: no reply: %w", sandbox.ErrGuestTimeout)
	case "/bin/sh":
		// the daemon's naming script (sandbox names.go): the hostname
		// is set, /etc/hosts printed when the fake holds one
		if !sandbox.IsNamingExec(r) {
			fmt.Fprintln(stderr, "sh: only the naming script runs here")
			res.ExitCode = 127
			break
		}
		a.reg.mu.Lock()
		a.hostname = r.Argv[4]
		b, ok := a.fs["/etc/hosts"]
		a.reg.mu.Unlock()
		if !ok {
			res.ExitCode = 4
			break
		}
		_, _ = stdout.Write(b)
	default:
		fmt.Fprintf(stderr, "%s: command not found\n", r.Argv[0])
		res.ExitCode = 127
	}
	return res, nil
}

// WriteFile implements sandbox.Guest.
func (a *Guest) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	if err := a.alive(); err != nil {
		return err
	}
	if err := checkClean(path); err != nil {
		return err
	}
	if a.isDir(path) {
		return fmt.Errorf("write %s: %w", path, sandbox.ErrIsDirectory)
	}
	if strings.HasPrefix(path, "/proc/") {
		return fmt.Errorf("write %s: %w", path, sandbox.ErrPermission)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	a.reg.mu.Lock()
	defer a.reg.mu.Unlock()
	a.fs[path] = b
	return nil
}

// ReadFile implements sandbox.Guest.
func (a *Guest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	if err := a.alive(); err != nil {
		return 0, err
	}
	if err := checkClean(path); err != nil {
		return 0, err
	}
	a.reg.mu.Lock()
	b, ok := a.fs[path]
	a.reg.mu.Unlock()
	switch {
	case a.isDir(path):
		return 0, fmt.Errorf("read %s: %w", path, sandbox.ErrIsDirectory)
	case !ok:
		return 0, fmt.Errorf("read %s: %w", path, sandbox.ErrFileNotFound)
	case int64(len(b)) > max:
		n, _ := w.Write(b[:max])
		return int64(n), fmt.Errorf("read %s: %w", path, sandbox.ErrTooLarge)
	}
	n, err := w.Write(b)
	return int64(n), err
}

// checkClean refuses a path that is not clean, as the real guest agent
// client does (qga checkGuestPath: invalid, which the daemon answers 400),
// so that a handler handing the guest an unclean path fails here too.
func checkClean(p string) error {
	if path.Clean(p) != p {
		return fmt.Errorf("%w: guest path %q is not clean (want %q)", sandbox.ErrGuestInvalid, p, path.Clean(p))
	}
	return nil
}

// baseDirs are directories every guest has.
var baseDirs = map[string]bool{"/": true, "/etc": true, "/tmp": true, "/root": true, "/home": true, "/proc": true}

// isDir says whether p is a directory of the guest: a base one or the
// parent of a file written.
func (a *Guest) isDir(p string) bool {
	if baseDirs[p] {
		return true
	}
	a.reg.mu.Lock()
	defer a.reg.mu.Unlock()
	for f := range a.fs {
		if strings.HasPrefix(f, p+"/") {
			return true
		}
	}
	return false
}

// SetPingFails makes VM id's agent stop answering (fail) or answer again.
func (g *Guests) SetPingFails(id int, fail bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.PingFails[id] = fail
}

// SetVMState sets VM id's Proxmox status and QMP status behind the
// daemon's back (qmp "" keeps QMP in step with status).
func (p *Proxmox) SetVMState(id int, status, qmp string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v, ok := p.VMs[id]; ok {
		v.Info.Status = status
		v.QMPStatus = qmp
	}
}

// VMStatus implements sandbox.VMStatusReader.
func (p *Proxmox) VMStatus(ctx context.Context, id int) (sandbox.VMRunState, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.call("VMStatus"); err != nil {
		return sandbox.VMRunState{}, err
	}
	v, err := p.vm(id)
	if err != nil {
		return sandbox.VMRunState{}, err
	}
	qmp := v.QMPStatus
	if qmp == "" {
		qmp = v.Info.Status
	}
	return sandbox.VMRunState{Status: v.Info.Status, QMPStatus: qmp}, nil
}
