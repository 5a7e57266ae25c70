package kvm

import (
	"errors"
	"fmt"
	"io"
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

// maxUserData bounds the user-data read back from a seed.
const maxUserData = 1 << 20

// ReadUserData reads user-data back from a seed ISO (clone takes the
// source's user-data from its seed volume).
func ReadUserData(path string) ([]byte, error) {
	b, err := file.OpenFromPath(path, true)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	defer b.Close()
	size, err := b.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	fsys, err := iso9660.Read(b, size, 0, 2048)
	if err != nil {
		return nil, fmt.Errorf("seed: not an ISO 9660 image: %w", err)
	}
	f, err := fsys.OpenFile("/user-data", os.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("seed: user-data: %w", err)
	}
	defer f.Close()
	ud, err := io.ReadAll(io.LimitReader(f, maxUserData+1))
	if err != nil {
		return nil, fmt.Errorf("seed: user-data: %w", err)
	}
	if len(ud) == 0 || len(ud) > maxUserData {
		return nil, fmt.Errorf("seed: user-data is %d bytes, want 1 to %d", len(ud), maxUserData)
	}
	return ud, nil
}
