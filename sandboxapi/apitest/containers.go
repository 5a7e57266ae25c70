package apitest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// CTs is an in-memory container API (sandbox.Containers) sharing its
// Proxmox's one VMID space and fake guests: a container is a FakeVM whose
// Info.Kind is "lxc", which the QEMU calls never see (as Proxmox's qemu
// endpoints answer "does not exist" for a CT's id), with its config in
// Configs.
type CTs struct {
	p *Proxmox
	// Configs is each container's config as GET .../lxc/{vmid}/config
	// gives it (under p's lock).
	Configs map[int]map[string]string
}

// NewCTs returns the container API of p.
func NewCTs(p *Proxmox) *CTs { return &CTs{p: p, Configs: map[int]map[string]string{}} }

// AddTemplate adds a container template called name with config conf.
func (c *CTs) AddTemplate(id int, name string, conf map[string]string) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.VMs[id] = &FakeVM{Info: sandbox.VMInfo{VMID: id, Name: name, Status: "stopped", Template: true, Kind: apitype.KindLXC}}
	c.Configs[id] = maps.Clone(conf)
}

// SetConfig sets key of container id's config behind the daemon's back
// ("" deletes it).
func (c *CTs) SetConfig(id int, key, value string) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if value == "" {
		delete(c.Configs[id], key)
		return
	}
	c.Configs[id][key] = value
}

// ctLocked returns container id (ErrNotFound for none, or a VM's id).
func (c *CTs) ctLocked(id int) (*FakeVM, error) {
	v, ok := c.p.VMs[id]
	if !ok || v.Info.Kind != apitype.KindLXC {
		return nil, fmt.Errorf("ct %d: %w", id, sandbox.ErrNotFound)
	}
	return v, nil
}

// CTTemplateID implements sandbox.Containers.
func (c *CTs) CTTemplateID(ctx context.Context, name string) (int, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("CTTemplateID"); err != nil {
		return 0, err
	}
	for id, v := range c.p.VMs {
		if v.Info.Kind == apitype.KindLXC && v.Info.Template && v.Info.Name == name {
			return id, nil
		}
	}
	return 0, fmt.Errorf("container template %q: %w", name, sandbox.ErrNotFound)
}

// CloneCT implements sandbox.Containers: the clone copies the template's
// config (as pve-container's clone_vm does).
func (c *CTs) CloneCT(ctx context.Context, s sandbox.CloneSpec) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("CloneCT"); err != nil {
		return err
	}
	t, err := c.ctLocked(s.Template)
	if err != nil || !t.Info.Template {
		return fmt.Errorf("clone: container template %d: %w", s.Template, sandbox.ErrNotFound)
	}
	if c.p.VMs[s.NewID] != nil {
		return fmt.Errorf("clone: ct %d: %w", s.NewID, sandbox.ErrExists)
	}
	if s.Pool != "" && !c.p.Pools[s.Pool] {
		return fmt.Errorf("clone: pool %q does not exist", s.Pool)
	}
	c.p.VMs[s.NewID] = &FakeVM{Info: sandbox.VMInfo{VMID: s.NewID, Name: s.Name, Status: "stopped", Pool: s.Pool, Kind: apitype.KindLXC},
		Snapshots: map[string]map[string][]byte{}}
	conf := maps.Clone(c.Configs[s.Template])
	conf["hostname"] = s.Name
	c.Configs[s.NewID] = conf
	return nil
}

// ConfigureCT implements sandbox.Containers.
func (c *CTs) ConfigureCT(ctx context.Context, id int, cfg sandbox.CTConfig) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("ConfigureCT"); err != nil {
		return err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return err
	}
	v.Info.Tags = slices.Clone(cfg.Tags)
	v.Config = sandbox.VMConfig{Tags: cfg.Tags, Cores: cfg.Cores, MemoryMiB: cfg.MemoryMiB, Bridges: cfg.Bridges, MACs: cfg.MACs}
	conf := c.Configs[id]
	conf["hostname"], conf["tags"] = cfg.Hostname, strings.Join(cfg.Tags, ";")
	conf["cores"], conf["memory"], conf["swap"] = fmt.Sprint(cfg.Cores), fmt.Sprint(cfg.MemoryMiB), "0"
	for k := range conf {
		if strings.HasPrefix(k, "net") {
			delete(conf, k)
		}
	}
	for k, b := range cfg.Bridges {
		conf[fmt.Sprintf("net%d", k)] = fmt.Sprintf("name=eth%d,bridge=%s,ip=dhcp", k, b)
	}
	return nil
}

// SetCTTags implements sandbox.Containers: tags and hostname, nothing
// else (a running container takes both at once).
func (c *CTs) SetCTTags(ctx context.Context, id int, hostname string, tags []string) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("SetCTTags"); err != nil {
		return err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return err
	}
	v.Info.Name = hostname
	v.Info.Tags = slices.Clone(tags)
	v.Config.Tags = slices.Clone(tags)
	c.Configs[id]["hostname"], c.Configs[id]["tags"] = hostname, strings.Join(tags, ";")
	return nil
}

// StartCT implements sandbox.Containers.
func (c *CTs) StartCT(ctx context.Context, id int) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("StartCT"); err != nil {
		return err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return err
	}
	for _, b := range v.Config.Bridges {
		if !c.p.applied[b] {
			return fmt.Errorf("start ct %d: bridge %q does not exist (SDN not applied)", id, b)
		}
	}
	v.Info.Status = "running"
	if c.p.Guests != nil {
		c.p.Guests.up(id)
	}
	return nil
}

// StopCT implements sandbox.Containers: a container that does not run
// is no error.
func (c *CTs) StopCT(ctx context.Context, id int) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("StopCT"); err != nil {
		return err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return err
	}
	v.Info.Status = "stopped"
	if c.p.Guests != nil {
		c.p.Guests.down(id)
	}
	return nil
}

// DeleteCT implements sandbox.Containers (with force: a running one is
// stopped first).
func (c *CTs) DeleteCT(ctx context.Context, id int) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("DeleteCT"); err != nil {
		return err
	}
	if _, err := c.ctLocked(id); err != nil {
		return err
	}
	delete(c.p.VMs, id)
	delete(c.Configs, id)
	if c.p.Guests != nil {
		c.p.Guests.remove(id)
	}
	return nil
}

// CT implements sandbox.Containers.
func (c *CTs) CT(ctx context.Context, id int) (sandbox.VMInfo, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("CT"); err != nil {
		return sandbox.VMInfo{}, err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return sandbox.VMInfo{}, err
	}
	info := v.Info
	info.Tags = slices.Clone(info.Tags)
	return info, nil
}

// ListCTs implements sandbox.Containers.
func (c *CTs) ListCTs(ctx context.Context) ([]sandbox.VMInfo, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("ListCTs"); err != nil {
		return nil, err
	}
	var out []sandbox.VMInfo
	for _, v := range c.p.VMs {
		if v.Info.Kind == apitype.KindLXC {
			info := v.Info
			info.Tags = slices.Clone(info.Tags)
			out = append(out, info)
		}
	}
	return out, nil
}

// CTConfigValues implements sandbox.Containers.
func (c *CTs) CTConfigValues(ctx context.Context, id int) (map[string]string, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("CTConfigValues"); err != nil {
		return nil, err
	}
	if _, err := c.ctLocked(id); err != nil {
		return nil, err
	}
	return maps.Clone(c.Configs[id]), nil
}

// SnapshotCT implements sandbox.Containers: it copies the guest's files.
func (c *CTs) SnapshotCT(ctx context.Context, id int, name string) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("SnapshotCT"); err != nil {
		return err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return err
	}
	if _, ok := v.Snapshots[name]; ok {
		return fmt.Errorf("snapshot %q: %w", name, sandbox.ErrExists)
	}
	v.Snapshots[name] = c.p.Guests.files(id)
	return nil
}

// RollbackCT implements sandbox.Containers: it restores the guest's
// files and leaves the container stopped.
func (c *CTs) RollbackCT(ctx context.Context, id int, name string) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if err := c.p.call("RollbackCT"); err != nil {
		return err
	}
	v, err := c.ctLocked(id)
	if err != nil {
		return err
	}
	snap, ok := v.Snapshots[name]
	if !ok {
		return fmt.Errorf("snapshot %q: %w", name, sandbox.ErrNotFound)
	}
	c.p.Guests.setFiles(id, snap)
	v.Info.Status = "stopped"
	c.p.Guests.down(id)
	return nil
}
