package kvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Clone makes dst from the stopped node src and starts it: an independent
// copy of src's disk (no backing file), the same user-data in a fresh seed
// with a new instance id (so cloud-init runs the recipe again and its
// per-instance step makes fresh secrets), a new MAC and its own address.
func (m *Manager) Clone(ctx context.Context, src, dst string) (Node, error) {
	sd, smeta, err := m.lookup(src)
	if err != nil {
		return Node{}, fmt.Errorf("clone: %w", err)
	}
	if !ValidName(dst) {
		return Node{}, fmt.Errorf("clone: node name %q: want lowercase letters, digits and dashes (max 32)", dst)
	}
	if err := m.nameFree(dst); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	if st, _, err := m.conn.DomainGetState(sd, 0); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", src, err)
	} else if libvirt.DomainState(st) != libvirt.DomainShutoff {
		return Node{}, fmt.Errorf("clone %s: the source is running; stop it first (pve-bootstrap nested stop %s)", src, src)
	}
	x, err := m.conn.DomainGetXMLDesc(sd, libvirt.DomainXMLInactive)
	if err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", src, err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", src, err)
	}
	pool, err := m.conn.StoragePoolLookupByName(m.cfg.Pool)
	if err != nil {
		return Node{}, fmt.Errorf("clone %s: pool %s: %w", src, m.cfg.Pool, err)
	}
	ud, err := m.userData(pool, seedVol(src))
	if err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", src, err)
	}
	var u undo
	ok := false
	defer func() {
		if !ok {
			u.run(m.log)
		}
	}()
	if err := m.copyDisk(&u, pool, diskVol(src), diskVol(dst)); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	id, err := newInstanceID(dst)
	if err != nil {
		return Node{}, err
	}
	if err := m.uploadSeed(&u, pool, seedVol(dst), Seed{UserData: ud, MetaData: MetaData(id, dst)}); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	mac, err := newMAC()
	if err != nil {
		return Node{}, err
	}
	addr, err := m.reserve(&u, smeta.Network, dst, mac)
	if err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	meta := NodeMeta{InstanceID: id, Network: smeta.Network, Address: addr.String(), MAC: mac, Created: m.now().UTC().Truncate(time.Second), ClonedFrom: src}
	if err := retarget(&d, src, dst, mac, filepath.Join(m.cfg.LogDir, dst+"-serial.log"), meta); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	auto, err := m.conn.DomainGetAutostart(sd)
	if err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", src, err)
	}
	if err := m.define(&u, &d, auto == 1); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	ok = true
	return m.Get(dst)
}

// retarget turns src's domain definition into dst's: name, identity,
// volumes, MAC, serial log and tag.
func retarget(d *libvirtxml.Domain, src, dst, mac, serialLog string, meta NodeMeta) error {
	mx, err := meta.xml()
	if err != nil {
		return err
	}
	d.Name, d.UUID, d.ID, d.GenID = dst, "", nil, nil
	d.Metadata = &libvirtxml.DomainMetadata{XML: mx}
	if d.Devices == nil || len(d.Devices.Interfaces) != 1 {
		return fmt.Errorf("domain %s: want exactly one network interface", src)
	}
	d.Devices.Interfaces[0].MAC = &libvirtxml.DomainInterfaceMAC{Address: mac}
	d.Devices.Interfaces[0].Target = nil
	vols := map[string]string{diskVol(src): diskVol(dst), seedVol(src): seedVol(dst)}
	n := 0
	for _, disk := range d.Devices.Disks {
		if disk.Source == nil || disk.Source.Volume == nil {
			continue
		}
		if v, ok := vols[disk.Source.Volume.Volume]; ok {
			disk.Source.Volume.Volume = v
			n++
		}
	}
	if n != 2 {
		return fmt.Errorf("domain %s: found %d of its 2 volumes", src, n)
	}
	for i := range d.Devices.Serials {
		if d.Devices.Serials[i].Log != nil {
			d.Devices.Serials[i].Log.File = serialLog
		}
	}
	return nil
}

// copyDisk copies a node's qcow2 volume into a new independent one.
func (m *Manager) copyDisk(u *undo, p libvirt.StoragePool, src, dst string) error {
	sv, err := m.conn.StorageVolLookupByName(p, src)
	if err != nil {
		return fmt.Errorf("volume %s: %w", src, err)
	}
	_, capacity, _, err := m.conn.StorageVolGetInfo(sv)
	if err != nil {
		return fmt.Errorf("volume %s: %w", src, err)
	}
	vx := plainVolXML(dst, "qcow2", int64(capacity))
	x, err := vx.Marshal()
	if err != nil {
		return err
	}
	v, err := m.conn.StorageVolCreateXMLFrom(p, x, sv, 0)
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	u.push(func() error { return m.conn.StorageVolDelete(v, 0) })
	return nil
}

// userData downloads a seed volume and reads its user-data.
func (m *Manager) userData(p libvirt.StoragePool, vol string) ([]byte, error) {
	v, err := m.conn.StorageVolLookupByName(p, vol)
	if err != nil {
		return nil, fmt.Errorf("seed volume %s: %w", vol, err)
	}
	f, err := os.CreateTemp("", "pve-nested-seed-*.iso")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := m.conn.StorageVolDownload(v, f, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("download %s: %w", vol, err)
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return ReadUserData(f.Name())
}
