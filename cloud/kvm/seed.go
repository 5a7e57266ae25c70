package kvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// SeedLabel is the volume label cloud-init's NoCloud source looks for.
const SeedLabel = "cidata"

// Seed is the content of a NoCloud seed.
type Seed struct {
	UserData      []byte
	MetaData      []byte
	NetworkConfig []byte // optional
}

// MetaData renders NoCloud meta-data for an instance.
func MetaData(instanceID, hostname string) []byte {
	return fmt.Appendf(nil, "instance-id: %s\nlocal-hostname: %s\n", instanceID, hostname)
}

// WriteSeedISO writes the seed as an ISO 9660 image labelled cidata, with
// Rock Ridge names.
func WriteSeedISO(path string, s Seed) error {
	if len(s.UserData) == 0 || len(s.MetaData) == 0 {
		return errors.New("seed: user-data and meta-data are required")
	}
	files := map[string][]byte{"user-data": s.UserData, "meta-data": s.MetaData}
	if len(s.NetworkConfig) > 0 {
		files["network-config"] = s.NetworkConfig
	}
	size := int64(1 << 20)
	for _, b := range files {
		size += int64(len(b)) + 2048
	}
	work, err := os.MkdirTemp(filepath.Dir(path), ".seed-work-*")
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer os.RemoveAll(work)
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	b, err := file.CreateFromPath(tmp, size)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer os.Remove(tmp)
	fsys, err := iso9660.Create(b, size, 0, 2048, work)
	if err != nil {
		b.Close()
		return fmt.Errorf("seed: %w", err)
	}
	for name, data := range files {
		f, err := fsys.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			b.Close()
			return fmt.Errorf("seed: %s: %w", name, err)
		}
		if _, err := f.Write(data); err != nil {
			b.Close()
			return fmt.Errorf("seed: %s: %w", name, err)
		}
		f.Close()
	}
	if err := fsys.Finalize(iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: SeedLabel}); err != nil {
		b.Close()
		return fmt.Errorf("seed: finalize: %w", err)
	}
	if err := b.Close(); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}
