package kvm

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// ensurePool returns the storage pool, creating and starting it when
// missing.
func (m *Manager) ensurePool(u *undo) (libvirt.StoragePool, error) {
	p, err := m.conn.StoragePoolLookupByName(m.cfg.Pool)
	if isCode(err, libvirt.ErrNoStoragePool) {
		px, err := PoolXML(m.cfg.Pool, m.cfg.PoolDir)
		if err != nil {
			return p, err
		}
		x, err := px.Marshal()
		if err != nil {
			return p, err
		}
		if p, err = m.conn.StoragePoolDefineXML(x, 0); err != nil {
			return p, fmt.Errorf("define pool %s: %w", m.cfg.Pool, err)
		}
		u.push(func() error { return m.conn.StoragePoolUndefine(p) })
		if err := m.conn.StoragePoolBuild(p, libvirt.StoragePoolBuildNew); err != nil {
			return p, fmt.Errorf("build pool %s: %w", m.cfg.Pool, err)
		}
		u.push(func() error { return m.conn.StoragePoolDelete(p, 0) })
		if err := m.conn.StoragePoolSetAutostart(p, 1); err != nil {
			return p, fmt.Errorf("pool %s: autostart: %w", m.cfg.Pool, err)
		}
		m.log.Info("storage pool created", "pool", m.cfg.Pool, "dir", m.cfg.PoolDir)
	} else if err != nil {
		return p, fmt.Errorf("pool %s: %w", m.cfg.Pool, err)
	}
	if active, err := m.conn.StoragePoolIsActive(p); err != nil {
		return p, fmt.Errorf("pool %s: %w", m.cfg.Pool, err)
	} else if active == 0 {
		if err := m.conn.StoragePoolCreate(p, 0); err != nil {
			return p, fmt.Errorf("start pool %s: %w", m.cfg.Pool, err)
		}
		u.push(func() error { return m.conn.StoragePoolDestroy(p) })
	}
	return p, nil
}

func (m *Manager) createVol(u *undo, p libvirt.StoragePool, vx *libvirtxml.StorageVolume) (libvirt.StorageVol, error) {
	x, err := vx.Marshal()
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	v, err := m.conn.StorageVolCreateXML(p, x, 0)
	if err != nil {
		return v, fmt.Errorf("volume %s: %w", vx.Name, err)
	}
	u.push(func() error { return m.conn.StorageVolDelete(v, 0) })
	return v, nil
}

// baseVolume makes sure the verified image is a volume in the pool, named
// after its digest so a different image never takes its place, and
// returns the volume's path. A volume already there is read back and
// hashed first. An upload is taken back with the rest when the create
// fails.
func (m *Manager) baseVolume(u *undo, p libvirt.StoragePool, file string) (string, error) {
	sum, err := fileSHA512(file)
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	name := strings.TrimSuffix(path.Base(file), ".qcow2") + "-" + sum[:16] + ".qcow2"
	if v, err := m.conn.StorageVolLookupByName(p, name); err == nil {
		// An upload cut short (or a hand edit) leaves a volume under the
		// right name with the wrong bytes: read it back before trusting it.
		h := sha512.New()
		if err := m.conn.StorageVolDownload(v, h, 0, 0, 0); err != nil {
			return "", fmt.Errorf("base image: read back %s: %w", name, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			return "", fmt.Errorf("base image: volume %s in pool %s is not the verified image (sha512 %s, want %s); "+
				"it may back other nodes' disks: check them, then `virsh vol-delete --pool %s %s`", name, m.cfg.Pool, got[:16], sum[:16], m.cfg.Pool, name)
		}
		return m.conn.StorageVolGetPath(v)
	} else if !isCode(err, libvirt.ErrNoStorageVol) {
		return "", fmt.Errorf("base image: %w", err)
	}
	v, err := m.upload(u, p, name, file)
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	m.log.Info("base image uploaded to the pool", "volume", name)
	return m.conn.StorageVolGetPath(v)
}

// upload creates a raw volume the size of file and streams file into it.
func (m *Manager) upload(u *undo, p libvirt.StoragePool, name, file string) (libvirt.StorageVol, error) {
	f, err := os.Open(file)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	v, err := m.createVol(u, p, plainVolXML(name, "raw", st.Size()))
	if err != nil {
		return v, err
	}
	if err := m.conn.StorageVolUpload(v, f, 0, uint64(st.Size()), 0); err != nil {
		return v, fmt.Errorf("upload %s: %w", name, err)
	}
	return v, nil
}

// uploadSeed builds the NoCloud seed ISO locally and uploads it as vol.
func (m *Manager) uploadSeed(u *undo, p libvirt.StoragePool, vol string, s Seed) error {
	dir, err := os.MkdirTemp("", "pve-nested-seed-*")
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer os.RemoveAll(dir)
	iso := filepath.Join(dir, "seed.iso")
	if err := WriteSeedISO(iso, s); err != nil {
		return err
	}
	if _, err := m.upload(u, p, vol, iso); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}
