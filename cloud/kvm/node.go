package kvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Node is a nested Proxmox node as libvirt knows it.
type Node struct {
	Name string
	NodeMeta
	// State is libvirt's domain state ("running", "shut off", ...).
	State     string
	Running   bool
	Autostart bool
	// APIURL is the node's Proxmox API on its reserved address.
	APIURL string
	// SerialLog is the file the serial console is copied to.
	SerialLog string
}

// CreateOptions describe a new node.
type CreateOptions struct {
	Name      string
	Image     Image
	CacheDir  string
	UserData  []byte
	CPUs      int
	MemoryMiB int
	DiskGiB   int
	// Accel is "kvm" (default) or "tcg".
	Accel string
	// Network is the libvirt network (default: the one the Manager owns).
	Network string
	// NoAutostart leaves the domain off at host boot.
	NoAutostart bool

	// kernel boots a kernel directly (tests only).
	kernel *directBoot
}

type directBoot struct{ kernel, initrd, cmdline string }

func newInstanceID(name string) (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return name + "-" + hex.EncodeToString(b), nil
}

// Create builds a node and starts it. Input is checked before anything is
// made; when a later step fails, what was made is taken back.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (Node, error) {
	if o.Accel == "" {
		o.Accel = "kvm"
	}
	if o.Network == "" {
		o.Network = m.cfg.Network
	}
	spec := DomainSpec{
		Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, Accel: o.Accel, Pool: m.cfg.Pool,
		Disk: diskVol(o.Name), Seed: seedVol(o.Name), Network: o.Network, MAC: "52:54:00:00:00:00",
		SerialLog: filepath.Join(m.cfg.LogDir, o.Name+"-serial.log"),
	}
	if err := spec.check(); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if o.DiskGiB < 8 {
		return Node{}, fmt.Errorf("create %s: disk %d GiB: want at least 8", o.Name, o.DiskGiB)
	}
	if len(o.UserData) == 0 {
		return Node{}, fmt.Errorf("create %s: no user-data", o.Name)
	}
	if o.Accel == "kvm" && m.cfg.remote {
		m.log.Warn("nested virtualization not checked on a remote libvirt host", "uri", m.cfg.URI)
	} else if o.Accel == "kvm" {
		if err := CheckNested(m.cfg.SysRoot); err != nil {
			return Node{}, fmt.Errorf("create %s: %w (or pass --accel tcg: slow, and the node cannot run VMs)", o.Name, err)
		}
	}
	if err := m.nameFree(o.Name); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if err := m.checkNetwork(o.Network); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	base, err := o.Image.Fetch(ctx, m.cfg.HTTP, o.CacheDir)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	var u undo
	ok := false
	defer func() {
		if !ok {
			u.run(m.log)
		}
	}()
	pool, err := m.ensurePool(&u)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	basePath, err := m.baseVolume(&u, pool, base)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if _, err := m.createVol(&u, pool, overlayXML(spec.Disk, basePath, o.DiskGiB)); err != nil {
		return Node{}, fmt.Errorf("create %s: disk: %w", o.Name, err)
	}
	id, err := newInstanceID(o.Name)
	if err != nil {
		return Node{}, err
	}
	if err := m.uploadSeed(&u, pool, spec.Seed, Seed{UserData: o.UserData, MetaData: MetaData(id, o.Name)}); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if o.kernel != nil {
		spec.Kernel, spec.Initrd, spec.Cmdline = o.kernel.kernel, o.kernel.initrd, o.kernel.cmdline
	}
	spec.Meta = NodeMeta{InstanceID: id, Network: o.Network, Created: m.now().UTC().Truncate(time.Second)}
	if err := m.defineAndStart(&u, spec, !o.NoAutostart); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	ok = true
	return m.Get(o.Name)
}

// defineAndStart reserves an address for the node, defines its domain and
// starts it.
func (m *Manager) defineAndStart(u *undo, spec DomainSpec, autostart bool) error {
	mac, err := newMAC()
	if err != nil {
		return err
	}
	addr, err := m.reserve(u, spec.Network, spec.Name, mac)
	if err != nil {
		return err
	}
	spec.MAC, spec.Meta.MAC, spec.Meta.Address = mac, mac, addr.String()
	d, err := spec.Domain()
	if err != nil {
		return err
	}
	return m.define(u, d, autostart)
}

func (m *Manager) define(u *undo, d *libvirtxml.Domain, autostart bool) error {
	x, err := d.Marshal()
	if err != nil {
		return err
	}
	dom, err := m.conn.DomainDefineXML(x)
	if err != nil {
		return fmt.Errorf("define domain: %w", err)
	}
	u.push(func() error {
		if st, _, err := m.conn.DomainGetState(dom, 0); err == nil && libvirt.DomainState(st) != libvirt.DomainShutoff {
			m.conn.DomainDestroy(dom)
		}
		return m.conn.DomainUndefine(dom)
	})
	if autostart {
		if err := m.conn.DomainSetAutostart(dom, 1); err != nil {
			return fmt.Errorf("autostart: %w", err)
		}
	}
	if err := m.conn.DomainCreate(dom); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return nil
}

func (m *Manager) nameFree(name string) error {
	_, err := m.conn.DomainLookupByName(name)
	if err == nil {
		return fmt.Errorf("a libvirt domain named %s exists (virsh dominfo %s): %w", name, name, ErrNameTaken)
	}
	if !isCode(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("look up domain: %w", err)
	}
	return nil
}

// lookup finds one of our nodes by name.
func (m *Manager) lookup(name string) (libvirt.Domain, NodeMeta, error) {
	if !ValidName(name) {
		return libvirt.Domain{}, NodeMeta{}, fmt.Errorf("node name %q: want lowercase letters, digits and dashes (max 32)", name)
	}
	d, err := m.conn.DomainLookupByName(name)
	if isCode(err, libvirt.ErrNoDomain) {
		return d, NodeMeta{}, fmt.Errorf("node %s: no such domain (pve-bootstrap nested list)", name)
	}
	if err != nil {
		return d, NodeMeta{}, fmt.Errorf("node %s: %w", name, err)
	}
	meta, err := m.meta(d)
	if err != nil {
		return d, NodeMeta{}, fmt.Errorf("node %s: %w", name, err)
	}
	return d, meta, nil
}

func (m *Manager) meta(d libvirt.Domain) (NodeMeta, error) {
	x, err := m.conn.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{MetadataURI}, 0)
	if isCode(err, libvirt.ErrNoDomainMetadata) {
		return NodeMeta{}, ErrNotOurs
	}
	if err != nil {
		return NodeMeta{}, err
	}
	return ParseNodeMeta(x)
}

var stateNames = map[libvirt.DomainState]string{
	libvirt.DomainNostate: "no state", libvirt.DomainRunning: "running", libvirt.DomainBlocked: "blocked",
	libvirt.DomainPaused: "paused", libvirt.DomainShutdown: "shutting down", libvirt.DomainShutoff: "shut off",
	libvirt.DomainCrashed: "crashed", libvirt.DomainPmsuspended: "suspended",
}

func (m *Manager) node(d libvirt.Domain, meta NodeMeta) (Node, error) {
	st, _, err := m.conn.DomainGetState(d, 0)
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", d.Name, err)
	}
	auto, err := m.conn.DomainGetAutostart(d)
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", d.Name, err)
	}
	n := Node{
		Name: d.Name, NodeMeta: meta, State: stateNames[libvirt.DomainState(st)],
		Running: libvirt.DomainState(st) != libvirt.DomainShutoff, Autostart: auto == 1,
		APIURL: apiURL(meta.Address),
	}
	if x, err := m.conn.DomainGetXMLDesc(d, libvirt.DomainXMLInactive); err == nil {
		var dx libvirtxml.Domain
		if dx.Unmarshal(x) == nil && dx.Devices != nil && len(dx.Devices.Serials) > 0 && dx.Devices.Serials[0].Log != nil {
			n.SerialLog = dx.Devices.Serials[0].Log.File
		}
	}
	return n, nil
}

// Get returns one node.
func (m *Manager) Get(name string) (Node, error) {
	d, meta, err := m.lookup(name)
	if err != nil {
		return Node{}, err
	}
	return m.node(d, meta)
}

// List returns every domain carrying our tag; other domains are left out.
func (m *Manager) List() ([]Node, error) {
	doms, _, err := m.conn.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []Node
	for _, d := range doms {
		meta, err := m.meta(d)
		if errors.Is(err, ErrNotOurs) {
			continue
		}
		if err != nil {
			m.log.Warn("domain with an unreadable pve-bootstrap tag", "domain", d.Name, "err", err)
			continue
		}
		n, err := m.node(d, meta)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Start starts a stopped node.
func (m *Manager) Start(ctx context.Context, name string) error {
	d, meta, err := m.lookup(name)
	if err != nil {
		return err
	}
	st, _, err := m.conn.DomainGetState(d, 0)
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	if libvirt.DomainState(st) != libvirt.DomainShutoff {
		return nil
	}
	var u undo
	if _, err := m.ensureNetwork(&u, meta.Network); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	if err := m.conn.DomainCreate(d); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	return nil
}

// Stop asks the node to shut down (ACPI) and, when it is still running
// after grace, powers it off.
func (m *Manager) Stop(ctx context.Context, name string, grace time.Duration) error {
	d, _, err := m.lookup(name)
	if err != nil {
		return err
	}
	return m.stop(ctx, d, grace)
}

func (m *Manager) stop(ctx context.Context, d libvirt.Domain, grace time.Duration) error {
	off := func() (bool, error) {
		st, _, err := m.conn.DomainGetState(d, 0)
		return libvirt.DomainState(st) == libvirt.DomainShutoff, err
	}
	if done, err := off(); err != nil || done {
		return err
	}
	if err := m.conn.DomainShutdown(d); err != nil {
		m.log.Warn("shutdown request failed; powering off", "node", d.Name, "err", err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := m.conn.DomainDestroy(d); err != nil {
				if done, _ := off(); done {
					return nil
				}
				return fmt.Errorf("stop %s: power off: %w", d.Name, err)
			}
			return nil
		case <-tick.C:
			done, err := off()
			if err != nil {
				return fmt.Errorf("stop %s: %w", d.Name, err)
			}
			if done {
				return nil
			}
		}
	}
}

// Delete powers a node off, removes its domain, volumes, address
// reservation and (on a local libvirt) its serial log.
func (m *Manager) Delete(ctx context.Context, name string) error {
	d, meta, err := m.lookup(name)
	if err != nil {
		return err
	}
	if err := m.stop(ctx, d, 0); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	n, _ := m.node(d, meta)
	if err := m.conn.DomainUndefine(d); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	var errs []error
	if p, err := m.conn.StoragePoolLookupByName(m.cfg.Pool); err == nil {
		for _, vol := range []string{diskVol(name), seedVol(name)} {
			v, err := m.conn.StorageVolLookupByName(p, vol)
			if isCode(err, libvirt.ErrNoStorageVol) {
				continue
			}
			if err == nil {
				err = m.conn.StorageVolDelete(v, 0)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", vol, err))
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("pool %s: %w", m.cfg.Pool, err))
	}
	if nw, err := m.conn.NetworkLookupByName(meta.Network); err == nil {
		h := libvirtxml.NetworkDHCPHost{MAC: meta.MAC, Name: name, IP: meta.Address}
		if err := m.updateHost(nw, libvirt.NetworkUpdateCommandDelete, h); err != nil {
			errs = append(errs, fmt.Errorf("network %s: reservation %s: %w", meta.Network, meta.Address, err))
		}
	}
	// The log is a file on the libvirt host: only a local one is ours to
	// remove.
	if n.SerialLog != "" && !m.cfg.remote {
		if err := os.Remove(n.SerialLog); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete %s: domain removed, but: %w", name, err)
	}
	return nil
}
