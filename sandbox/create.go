package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Caps are the resource guard's limits; 0 means unlimited.
type Caps struct {
	SandboxVCPUs     int `json:"sandbox_vcpus"`
	SandboxMemoryMiB int `json:"sandbox_memory_mib"`
	SandboxVMs       int `json:"sandbox_vms"`
	NodeVCPUs        int `json:"node_vcpus"`
	NodeMemoryMiB    int `json:"node_memory_mib"`
	NodeVMs          int `json:"node_vms"`
	NodeSandboxes    int `json:"node_sandboxes"`
}

// record is a sandbox as the daemon tracks it (and persists it).
type record struct {
	apitype.Sandbox
	// created is closed when a create finishes (success or teardown).
	created chan struct{}
	// deleted is closed when a delete finishes.
	deleted chan struct{}
	cancel  context.CancelFunc
	guests  map[int]Guest
	// egress is the policy asked for at create (nil: open); afterwards
	// the Egress part owns the sandbox's policy.
	egress *apitype.EgressPolicy
	// ops counts the guest and VM operations in flight (exec, files,
	// snapshots, check); opsCancel cancels them. Both are guarded by
	// Engine.mu for Add and cancel: a delete sets StateDeleting and
	// cancels under the lock, so no operation begins after it, then waits
	// for ops before it stops any VM (VM ids are reused: a stale exec must
	// not reach the next sandbox's VM).
	ops       sync.WaitGroup
	opsCtx    context.Context
	opsCancel context.CancelCauseFunc
}

// errDeleted is the cause given to operations cancelled by a delete.
var errDeleted = errors.New("the sandbox is being deleted")

// begin starts an operation on a ready sandbox's VM: it returns the
// sandbox, the VM, a context cancelled when the sandbox is deleted, and
// end, which must be called when the operation is over and turns an error
// caused by the delete into a conflict.
func (m *Engine) Begin(ctx context.Context, id, vm string) (apitype.Sandbox, apitype.VM, context.Context, func(error) error, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbx[id]
	if !ok {
		return apitype.Sandbox{}, apitype.VM{}, nil, nil, refuse(ErrUnknown, "sandbox %q not found", id)
	}
	if r.State != apitype.StateReady {
		return apitype.Sandbox{}, apitype.VM{}, nil, nil, refuse(ErrConflict, "sandbox %s is %s", id, r.State)
	}
	var v apitype.VM
	found := false
	for _, x := range r.VMs {
		if x.Name == vm || vm == "" && !found {
			v, found = x, true
		}
	}
	if !found {
		return apitype.Sandbox{}, apitype.VM{}, nil, nil, refuse(ErrUnknown, "sandbox %s has no VM %q", id, vm)
	}
	if r.opsCtx == nil {
		r.opsCtx, r.opsCancel = context.WithCancelCause(context.Background())
	}
	r.ops.Add(1)
	octx, cancel := context.WithCancelCause(ctx)
	ops := r.opsCtx
	stop := context.AfterFunc(ops, func() { cancel(context.Cause(ops)) })
	end := func(err error) error {
		stop()
		deleted := errors.Is(context.Cause(octx), errDeleted)
		cancel(nil)
		r.ops.Done()
		if err != nil && deleted {
			return refuse(ErrConflict, "sandbox %s was deleted during the call", id)
		}
		return err
	}
	return cloneSandbox(r.Sandbox), v, octx, end, nil
}

// reSandbox is the form of a sandbox id (newSandboxID).
var reSandbox = regexp.MustCompile(`^sb[a-z0-9]{6}$`)

// ValidID reports whether id has the form of a sandbox id ("sb" and six
// lowercase letters or digits).
func ValidID(id string) bool { return reSandbox.MatchString(id) }

// nodeTag and sandboxTag are the ownership tags (Proxmox pve-tag format).
func nodeTag(node string) string  { return "pvei-n-" + sanitizeTag(node) }
func sandboxTag(id string) string { return "pvei-s-" + id }

func sanitizeTag(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	return string(b)
}

// ownedBy reports whether tags carry this node's tag and the sandbox's tag,
// returning the sandbox id.
func (m *Engine) ownedBy(tags []string) (string, bool) {
	nt := nodeTag(m.o.Node)
	if !slices.Contains(tags, nt) {
		return "", false
	}
	for _, t := range tags {
		if id, ok := strings.CutPrefix(t, "pvei-s-"); ok && reSandbox.MatchString(id) {
			return id, true
		}
	}
	return "", false
}

// aliasTags splits a vnet alias into its tags.
func aliasTags(alias string) []string { return strings.Fields(alias) }

func (m *Engine) vmName(sb, vm string) string { return "pvei-" + sb + "-" + vm }

func newSandboxID() string {
	const alpha = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [6]byte
	_, _ = rand.Read(b[:])
	out := []byte("sb")
	for _, c := range b {
		out = append(out, alpha[int(c)%len(alpha)])
	}
	return string(out)
}

// vnetID derives the i-th vnet id (8 characters, Proxmox's limit) from the
// sandbox id.
func vnetID(sb string, i int) string { return "v" + sb[2:] + strconv.Itoa(i) }

// snapshot returns a copy of the public view of every sandbox.
func (m *Engine) List() []apitype.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]apitype.Sandbox, 0, len(m.sbx))
	for _, r := range m.sbx {
		out = append(out, cloneSandbox(r.Sandbox))
	}
	slices.SortFunc(out, func(a, b apitype.Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func cloneSandbox(s apitype.Sandbox) apitype.Sandbox {
	c := s
	c.Networks = slices.Clone(s.Networks)
	c.VMs = make([]apitype.VM, len(s.VMs))
	for i, v := range s.VMs {
		v.Networks = slices.Clone(v.Networks)
		c.VMs[i] = v
	}
	if s.Labels != nil {
		c.Labels = make(map[string]string, len(s.Labels))
		for k, v := range s.Labels {
			c.Labels[k] = v
		}
	}
	return c
}

func (m *Engine) Get(id string) (apitype.Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbx[id]
	if !ok {
		return apitype.Sandbox{}, false
	}
	return cloneSandbox(r.Sandbox), true
}

// updateGauges recomputes the by-state gauges; call with m.mu held.
func (m *Engine) updateGaugesLocked() {
	sb := map[string]int{}
	vms := map[string]int{}
	for _, r := range m.sbx {
		sb[r.State]++
		vms[r.State] += len(r.VMs)
	}
	for _, s := range []string{apitype.StateCreating, apitype.StateReady, apitype.StateDeleting, apitype.StateError} {
		m.met.sandboxes.WithLabelValues(s).Set(float64(sb[s]))
		m.met.vms.WithLabelValues(s).Set(float64(vms[s]))
	}
}

// guardLocked checks the caps for a new sandbox; call with m.mu held.
func (m *Engine) guardLocked(req *apitype.CreateRequest) error {
	c := m.o.Caps
	var cores, mem int
	for _, v := range req.VMs {
		cores += v.Cores
		mem += v.MemoryMiB
	}
	nodeCores, nodeMem, nodeVMs := cores, mem, len(req.VMs)
	for _, r := range m.sbx {
		for _, v := range r.VMs {
			nodeCores += v.Cores
			nodeMem += v.MemoryMiB
		}
		nodeVMs += len(r.VMs)
	}
	refuse := func(cp string, want, limit int) error {
		m.met.guardRefusals.WithLabelValues(cp).Inc()
		return &CapError{Cap: cp, Need: want, Limit: limit}
	}
	switch {
	case c.SandboxVMs > 0 && len(req.VMs) > c.SandboxVMs:
		return refuse("sandbox_vms", len(req.VMs), c.SandboxVMs)
	case c.SandboxVCPUs > 0 && cores > c.SandboxVCPUs:
		return refuse("sandbox_vcpus", cores, c.SandboxVCPUs)
	case c.SandboxMemoryMiB > 0 && mem > c.SandboxMemoryMiB:
		return refuse("sandbox_memory_mib", mem, c.SandboxMemoryMiB)
	case c.NodeSandboxes > 0 && len(m.sbx)+1 > c.NodeSandboxes:
		return refuse("node_sandboxes", len(m.sbx)+1, c.NodeSandboxes)
	case c.NodeVMs > 0 && nodeVMs > c.NodeVMs:
		return refuse("node_vms", nodeVMs, c.NodeVMs)
	case c.NodeVCPUs > 0 && nodeCores > c.NodeVCPUs:
		return refuse("node_vcpus", nodeCores, c.NodeVCPUs)
	case c.NodeMemoryMiB > 0 && nodeMem > c.NodeMemoryMiB:
		return refuse("node_memory_mib", nodeMem, c.NodeMemoryMiB)
	}
	return nil
}

// allocCIDRsLocked picks ranges for "auto" networks and checks explicit ones
// against every known range and the host's own networks; call with m.mu
// held (so two creates never pick the same range).
func (m *Engine) allocCIDRsLocked(nets []apitype.NetworkRequest, foreign, host []netip.Prefix) ([]netip.Prefix, error) {
	used := append(slices.Clone(foreign), host...)
	for _, r := range m.sbx {
		for _, n := range r.Networks {
			if p, err := netip.ParsePrefix(n.CIDR); err == nil {
				used = append(used, p)
			}
		}
	}
	overlaps := func(p netip.Prefix) bool {
		for _, u := range used {
			if u.Overlaps(p) {
				return true
			}
		}
		return false
	}
	out := make([]netip.Prefix, len(nets))
	for i, n := range nets {
		if n.CIDR == "auto" {
			continue
		}
		p := netip.MustParsePrefix(n.CIDR)
		for _, h := range host {
			if h.Overlaps(p) {
				return nil, refuse(ErrConflict, "network %q: cidr %s overlaps the host's network %s", n.Name, p, h)
			}
		}
		if overlaps(p) {
			return nil, refuse(ErrConflict, "network %q: cidr %s overlaps a range in use", n.Name, p)
		}
		out[i] = p
		used = append(used, p)
	}
	pool := m.o.AutoCIDRPool
	for i, n := range nets {
		if n.CIDR != "auto" {
			continue
		}
		found := false
		step := uint64(1) << (32 - m.o.AutoCIDRBits)
		base := pool.Masked().Addr().As4()
		start := uint64(base[0])<<24 | uint64(base[1])<<16 | uint64(base[2])<<8 | uint64(base[3])
		count := uint64(1) << (m.o.AutoCIDRBits - pool.Bits())
		for k := uint64(0); k < count; k++ {
			a := start + k*step
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), m.o.AutoCIDRBits)
			if !overlaps(p) {
				out[i] = p
				used = append(used, p)
				found = true
				break
			}
		}
		if !found {
			return nil, refuse(ErrNoFreeRange, "network %q: no free /%d left in %s", n.Name, m.o.AutoCIDRBits, pool)
		}
	}
	return out, nil
}

// rfc1918 are the private IPv4 ranges sandbox networks must come from.
var rfc1918 = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16")}

// PrivateV4 reports whether p lies wholly inside one RFC 1918 range.
func PrivateV4(p netip.Prefix) bool {
	for _, r := range rfc1918 {
		if p.Bits() >= r.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// subnetPlan returns gateway and DHCP range of a prefix.
func subnetPlan(p netip.Prefix) (gw, start, end netip.Addr) {
	a := p.Addr().As4()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	size := uint32(1) << (32 - p.Bits())
	mk := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	gw = mk(n + 1)
	start = mk(n + 10)
	if size <= 16 {
		start = mk(n + 2)
	}
	end = mk(n + size - 2)
	return gw, start, end
}

// templateID resolves a template name.
func (m *Engine) templateID(ctx context.Context, name string) (int, error) {
	if id, ok := m.o.Templates[name]; ok {
		return id, nil
	}
	id, err := m.cloner.TemplateID(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return 0, invalid("template", "unknown template %q", name)
	}
	if err != nil {
		return 0, pxErr("look up template "+name, err)
	}
	return id, nil
}

// create builds a sandbox and returns when every VM answers its agent; on
// failure everything created is removed.
func (m *Engine) Create(ctx context.Context, req apitype.CreateRequest) (apitype.Sandbox, error) {
	tmpl := make([]int, len(req.VMs))
	for i, v := range req.VMs {
		id, err := m.templateID(ctx, v.Template)
		if err != nil {
			return apitype.Sandbox{}, err
		}
		tmpl[i] = id
	}
	names := make([]string, len(req.VMs))
	for i, v := range req.VMs {
		names[i] = v.Template
	}
	if err := m.checkTemplates(ctx, names, tmpl); err != nil {
		return apitype.Sandbox{}, err
	}
	var foreign []netip.Prefix
	cidrs, err := m.zones.ListSubnetCIDRs(ctx)
	if err != nil {
		return apitype.Sandbox{}, pxErr("list subnets", err)
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			foreign = append(foreign, p.Masked())
		}
	}

	var host []netip.Prefix
	if m.o.HostNetworks != nil {
		if host, err = m.o.HostNetworks(ctx); err != nil {
			return apitype.Sandbox{}, fmt.Errorf("create: %w", err)
		}
	}

	now := m.o.Now()
	m.mu.Lock()
	if err := m.guardLocked(&req); err != nil {
		m.mu.Unlock()
		return apitype.Sandbox{}, err
	}
	id := newSandboxID()
	for m.sbx[id] != nil {
		id = newSandboxID()
	}
	prefixes, err := m.allocCIDRsLocked(req.Networks, foreign, host)
	if err != nil {
		m.mu.Unlock()
		return apitype.Sandbox{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.o.CreateTimeout)
	defer cancel()
	rec := &record{
		Sandbox: apitype.Sandbox{
			ID: id, State: apitype.StateCreating, Owner: req.Owner, Labels: req.Labels,
			CreatedAt: now, ExpiresAt: now.Add(time.Duration(req.TTLSeconds) * time.Second), Zone: id,
		},
		created: make(chan struct{}),
		cancel:  cancel,
		guests:  map[int]Guest{},
		egress:  req.Egress,
	}
	for i, n := range req.Networks {
		gw, _, _ := subnetPlan(prefixes[i])
		rec.Networks = append(rec.Networks, apitype.Network{
			Name: n.Name, VNet: vnetID(id, i), CIDR: prefixes[i].String(), Gateway: gw.String(),
			DHCP: n.DHCP == nil || *n.DHCP, SNAT: n.SNAT == nil || *n.SNAT,
		})
	}
	for _, v := range req.VMs {
		rec.VMs = append(rec.VMs, apitype.VM{Name: v.Name, Template: v.Template, Cores: v.Cores, MemoryMiB: v.MemoryMiB, DiskGiB: v.DiskGiB, Networks: v.Networks})
	}
	m.sbx[id] = rec
	m.updateGaugesLocked()
	m.mu.Unlock()
	defer close(rec.created)

	log := m.log.With("sandbox", id)
	if err := m.saveState(); err != nil {
		m.forget(id)
		return apitype.Sandbox{}, err
	}
	err = m.build(cctx, rec, tmpl, req.Env)
	if err != nil {
		log.Warn("create failed, tearing down", "err", err)
		tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.TeardownTimeout)
		defer tcancel()
		if terr := m.teardown(tctx, rec); terr != nil {
			log.Error("teardown after failed create", "err", terr)
			m.setState(id, apitype.StateError, fmt.Sprintf("create failed: %v; teardown failed: %v", err, terr))
			return apitype.Sandbox{}, err
		}
		m.forget(id)
		m.removeEgress(tctx, id, rec.Zone)
		if perr := m.publishZones(tctx); perr != nil {
			log.Error("publish zones after failed create", "err", perr)
		}
		return apitype.Sandbox{}, err
	}
	m.setState(id, apitype.StateReady, "")
	log.Info("sandbox ready", "vms", len(rec.VMs))
	sb, _ := m.Get(id)
	return sb, nil
}

// build creates the zone, vnets, subnets and VMs of rec.
func (m *Engine) build(ctx context.Context, rec *record, tmpl []int, env map[string]string) error {
	zones := m.zones
	id := rec.ID
	alias := nodeTag(m.o.Node) + " " + sandboxTag(id)
	if err := m.pools.EnsurePool(ctx, m.o.Pool); err != nil {
		return pxErr("ensure pool", err)
	}
	if err := zones.CreateZone(ctx, ZoneSpec{ID: id}); err != nil {
		return pxErr("create zone "+id, err)
	}
	for _, n := range rec.Networks {
		if err := zones.CreateVNet(ctx, VNetSpec{ID: n.VNet, Zone: id, Alias: alias}); err != nil {
			return pxErr("create vnet "+n.VNet, err)
		}
		p := netip.MustParsePrefix(n.CIDR)
		gw, start, end := subnetPlan(p)
		s := SubnetSpec{VNet: n.VNet, CIDR: n.CIDR, Gateway: gw.String(), SNAT: n.SNAT}
		if n.DHCP {
			s.DHCPStart, s.DHCPEnd = start.String(), end.String()
		}
		if err := zones.CreateSubnet(ctx, s); err != nil {
			return pxErr("create subnet "+n.CIDR, err)
		}
	}
	if err := m.applySDN(ctx); err != nil {
		return err
	}
	if err := m.publishZones(ctx); err != nil {
		return err
	}
	if err := m.applyEgress(ctx, rec); err != nil {
		return err
	}
	errs := make(chan error, len(rec.VMs))
	vctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range rec.VMs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.buildVM(vctx, rec, i, tmpl[i], env); err != nil {
				cancel()
				errs <- fmt.Errorf("vm %s: %w", rec.VMs[i].Name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var first error
	for err := range errs {
		if first == nil || errors.Is(first, context.Canceled) {
			first = err
		}
	}
	return first
}

func (m *Engine) applySDN(ctx context.Context) error {
	m.sdnMu.Lock()
	defer m.sdnMu.Unlock()
	return pxErr("apply sdn", m.zones.ApplySDN(ctx))
}

// allocVMID reserves a VM id; release it once the clone exists.
func (m *Engine) allocVMID(ctx context.Context) (int, error) {
	m.idMu.Lock()
	defer m.idMu.Unlock()
	id, err := m.cloner.NextID(ctx)
	if err != nil {
		return 0, pxErr("next vm id", err)
	}
	for m.reserved[id] {
		id++
	}
	m.reserved[id] = true
	return id, nil
}

func (m *Engine) releaseVMID(id int) {
	m.idMu.Lock()
	delete(m.reserved, id)
	m.idMu.Unlock()
}

func (m *Engine) buildVM(ctx context.Context, rec *record, i, tmpl int, env map[string]string) error {
	px := m.cloner
	m.mu.Lock()
	spec := rec.VMs[i]
	m.mu.Unlock()
	var vmid int
	for attempt := 0; ; attempt++ {
		id, err := m.allocVMID(ctx)
		if err != nil {
			return err
		}
		m.mu.Lock()
		rec.VMs[i].VMID = id
		m.mu.Unlock()
		if err := m.saveState(); err != nil {
			m.releaseVMID(id)
			return err
		}
		err = px.CloneVM(ctx, CloneSpec{Template: tmpl, NewID: id, Name: m.vmName(rec.ID, spec.Name), Pool: m.o.Pool})
		m.releaseVMID(id)
		if errors.Is(err, ErrExists) && attempt < 5 {
			m.mu.Lock()
			rec.VMs[i].VMID = 0
			m.mu.Unlock()
			continue
		}
		if err != nil {
			return pxErr(fmt.Sprintf("clone template %d to %d", tmpl, id), err)
		}
		vmid = id
		break
	}
	bridges := make([]string, len(spec.Networks))
	for k, n := range spec.Networks {
		for _, net := range rec.Networks {
			if net.Name == n {
				bridges[k] = net.VNet
			}
		}
	}
	cfg := VMConfig{Tags: []string{nodeTag(m.o.Node), sandboxTag(rec.ID)}, Cores: spec.Cores, MemoryMiB: spec.MemoryMiB, Bridges: bridges}
	if err := px.ConfigureVM(ctx, vmid, cfg); err != nil {
		return pxErr(fmt.Sprintf("configure vm %d", vmid), err)
	}
	if err := m.hardenClone(ctx, vmid); err != nil {
		return err
	}
	if spec.DiskGiB > 0 {
		if err := px.ResizeDisk(ctx, vmid, spec.DiskGiB); err != nil {
			return pxErr(fmt.Sprintf("resize disk of vm %d", vmid), err)
		}
	}
	if err := px.StartVM(ctx, vmid); err != nil {
		return pxErr(fmt.Sprintf("start vm %d", vmid), err)
	}
	if err := m.waitAgent(ctx, vmid); err != nil {
		return err
	}
	return m.writeEnv(ctx, vmid, env)
}

// guest returns the guest of a VM (the dialer decides about caching).
func (m *Engine) Guest(vmid int) Guest {
	return m.o.Guests(filepath.Join(m.o.QGADir, strconv.Itoa(vmid)+".qga"))
}

// waitAgent pings the VM's agent until it answers or AgentTimeout passes.
func (m *Engine) waitAgent(ctx context.Context, vmid int) error {
	ctx, cancel := context.WithTimeout(ctx, m.o.AgentTimeout)
	defer cancel()
	g := m.Guest(vmid)
	delay := 100 * time.Millisecond
	for {
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		err := g.Ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm %d: wait for guest agent: %w (last: %v)", vmid, ErrGuestUnavailable, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

func (m *Engine) setState(id, state, msg string) {
	m.mu.Lock()
	if r, ok := m.sbx[id]; ok {
		r.State = state
		r.Error = msg
	}
	m.updateGaugesLocked()
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
}

func (m *Engine) forget(id string) {
	m.mu.Lock()
	delete(m.sbx, id)
	m.updateGaugesLocked()
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
}

// extend sets a sandbox's expiry to now+ttl.
func (m *Engine) Extend(id string, ttl time.Duration) (apitype.Sandbox, error) {
	m.mu.Lock()
	r, ok := m.sbx[id]
	if !ok {
		m.mu.Unlock()
		return apitype.Sandbox{}, refuse(ErrUnknown, "sandbox %q not found", id)
	}
	if r.State != apitype.StateReady {
		m.mu.Unlock()
		return apitype.Sandbox{}, refuse(ErrConflict, "sandbox %q is %s", id, r.State)
	}
	r.ExpiresAt = m.o.Now().Add(ttl)
	sb := cloneSandbox(r.Sandbox)
	m.mu.Unlock()
	return sb, m.saveState()
}

// remove deletes a sandbox; deleting an unknown sandbox succeeds.
func (m *Engine) Delete(ctx context.Context, id string) error {
	_, err := m.removeIf(ctx, id, nil)
	return err
}

// removeIf deletes a sandbox when cond, checked under the lock at the moment
// the sandbox turns to deleting, holds (nil: always). It reports whether
// the sandbox was deleted (or already gone).
func (m *Engine) removeIf(ctx context.Context, id string, cond func(*record) bool) (bool, error) {
	m.mu.Lock()
	r, ok := m.sbx[id]
	if !ok {
		m.mu.Unlock()
		return true, nil
	}
	switch {
	case r.State == apitype.StateCreating:
		created := r.created
		r.cancel()
		m.mu.Unlock()
		select {
		case <-created:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		return m.removeIf(ctx, id, cond)
	case r.deleted != nil:
		d := r.deleted
		m.mu.Unlock()
		select {
		case <-d:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		return m.removeIf(ctx, id, cond)
	case cond != nil && !cond(r):
		m.mu.Unlock()
		return false, nil
	}
	r.State = apitype.StateDeleting
	r.deleted = make(chan struct{})
	if r.opsCancel != nil {
		r.opsCancel(errDeleted)
		r.opsCtx, r.opsCancel = nil, nil
	}
	d := r.deleted
	m.updateGaugesLocked()
	m.mu.Unlock()
	defer close(d)
	if err := m.saveState(); err != nil {
		return false, err
	}
	if err := waitOps(ctx, &r.ops); err != nil {
		m.mu.Lock()
		r.deleted = nil
		m.mu.Unlock()
		m.setState(id, apitype.StateError, "delete: operations still in flight: "+err.Error())
		return false, err
	}
	if err := m.teardown(ctx, r); err != nil {
		m.mu.Lock()
		r.deleted = nil
		m.mu.Unlock()
		m.setState(id, apitype.StateError, "delete failed: "+err.Error())
		return false, err
	}
	m.forget(id)
	m.removeEgress(ctx, id, r.Zone)
	m.log.Info("sandbox deleted", "sandbox", id)
	if err := m.publishZones(ctx); err != nil {
		m.log.Error("publish zones after delete", "err", err)
	}
	return true, nil
}

// waitOps waits for the operations in flight, or ctx.
func waitOps(ctx context.Context, ops *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { ops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for operations in flight: %w", ctx.Err())
	}
}

// publishZones hands every known sandbox zone and its vnets to
// Options.ZonesChanged.
func (m *Engine) publishZones(ctx context.Context) error {
	if m.o.ZonesChanged == nil {
		return nil
	}
	m.zonesMu.Lock()
	defer m.zonesMu.Unlock()
	zones := map[string][]string{}
	m.mu.Lock()
	for _, r := range m.sbx {
		for _, n := range r.Networks {
			zones[r.Zone] = append(zones[r.Zone], n.VNet)
		}
	}
	m.mu.Unlock()
	if err := m.o.ZonesChanged(ctx, zones); err != nil {
		return fmt.Errorf("publish sandbox zones: %w", err)
	}
	return nil
}

// teardown removes every Proxmox object of rec that carries (or was
// recorded with) its ownership.
func (m *Engine) teardown(ctx context.Context, rec *record) error {
	m.mu.Lock()
	vms := slices.Clone(rec.VMs)
	nets := slices.Clone(rec.Networks)
	id := rec.ID
	m.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(vms))
	for i, v := range vms {
		if v.VMID == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.deleteVM(ctx, id, v.VMID, m.vmName(id, v.Name))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return m.deleteSDN(ctx, id, nets)
}

// deleteVM stops and destroys a VM when it is owned by sandbox sb: both tags,
// or (a clone whose tagging failed) the exact name and pool this daemon
// recorded for it. Anything else is left alone.
func (m *Engine) deleteVM(ctx context.Context, sb string, vmid int, wantName string) error {
	px := m.vms
	info, err := px.VM(ctx, vmid)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return pxErr(fmt.Sprintf("read vm %d", vmid), err)
	}
	owner, tagged := m.ownedBy(info.Tags)
	switch {
	case info.Template:
		return nil
	case tagged && owner == sb:
	case !tagged && info.Name == wantName && info.Pool == m.o.Pool && !slices.ContainsFunc(info.Tags, func(t string) bool { return strings.HasPrefix(t, "pvei-") }):
	default:
		m.log.Warn("vm id recorded for sandbox is not ours; left alone", "sandbox", sb, "vmid", vmid, "tags", info.Tags, "name", info.Name)
		return nil
	}
	if info.Status != "stopped" {
		if err := px.StopVM(ctx, vmid); err != nil && !errors.Is(err, ErrNotFound) {
			return pxErr(fmt.Sprintf("stop vm %d", vmid), err)
		}
	}
	if err := px.DeleteVM(ctx, vmid); err != nil && !errors.Is(err, ErrNotFound) {
		return pxErr(fmt.Sprintf("delete vm %d", vmid), err)
	}
	return nil
}

// deleteSDN removes the sandbox's subnets, vnets (only those whose alias
// carries both tags) and zone, then applies.
func (m *Engine) deleteSDN(ctx context.Context, sb string, nets []apitype.Network) error {
	px := m.cleaner
	all, err := px.ListVNets(ctx)
	if err != nil {
		return pxErr("list vnets", err)
	}
	changed := false
	remaining := 0
	for _, v := range all {
		if v.Zone != sb {
			continue
		}
		owner, ok := m.ownedBy(aliasTags(v.Alias))
		if !ok || owner != sb {
			remaining++
			m.log.Warn("vnet in sandbox zone without our tags; left alone", "vnet", v.ID, "zone", v.Zone)
			continue
		}
		for _, n := range nets {
			if n.VNet == v.ID {
				if err := px.DeleteSubnet(ctx, v.ID, n.CIDR); err != nil && !errors.Is(err, ErrNotFound) {
					return pxErr("delete subnet "+n.CIDR, err)
				}
			}
		}
		if err := px.DeleteVNet(ctx, v.ID); err != nil && !errors.Is(err, ErrNotFound) {
			return pxErr("delete vnet "+v.ID, err)
		}
		changed = true
	}
	if remaining == 0 {
		err := px.DeleteZone(ctx, sb)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return pxErr("delete zone "+sb, err)
		default:
			changed = true
		}
	}
	if changed {
		return m.applySDN(ctx)
	}
	return nil
}

// RunReaper deletes expired sandboxes every ReaperInterval until ctx ends.
func (m *Engine) RunReaper(ctx context.Context) {
	t := time.NewTicker(m.o.ReaperInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Reap(ctx)
		}
	}
}

// Reap deletes every sandbox past its expiry once; it returns how many it
// deleted.
func (m *Engine) Reap(ctx context.Context) int {
	now := m.o.Now()
	var due []string
	m.mu.Lock()
	for id, r := range m.sbx {
		if (r.State == apitype.StateReady || r.State == apitype.StateError) && !now.Before(r.ExpiresAt) {
			due = append(due, id)
		}
	}
	m.mu.Unlock()
	// Each is checked again under the lock as it turns to deleting: one
	// extended since the list was made is left alone.
	expired := func(r *record) bool {
		return (r.State == apitype.StateReady || r.State == apitype.StateError) && !m.o.Now().Before(r.ExpiresAt)
	}
	n := 0
	for _, id := range due {
		rctx, cancel := context.WithTimeout(ctx, m.o.TeardownTimeout)
		deleted, err := m.removeIf(rctx, id, expired)
		cancel()
		if err != nil {
			m.log.Error("reaper: delete expired sandbox", "sandbox", id, "err", err)
			continue
		}
		if !deleted {
			m.log.Info("reaper: sandbox extended meanwhile; kept", "sandbox", id)
			continue
		}
		m.met.reaped.Inc()
		m.log.Info("reaper: deleted expired sandbox", "sandbox", id)
		n++
	}
	return n
}
