package pveemu

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
)

// CloudQCOW2 is a small qcow2 image of virtual size size for a bed's
// image server: the header the emulator's download and import read
// (magic, version 3, cluster bits 16, the size, no backing file), padded
// to 4 KiB. The bed's guests boot the host's root whatever the image.
func CloudQCOW2(size uint64) []byte {
	b := make([]byte, 4096)
	copy(b, qcow2Magic)
	binary.BigEndian.PutUint32(b[4:], 3)
	binary.BigEndian.PutUint32(b[20:], 16)
	binary.BigEndian.PutUint64(b[24:], size)
	b[4095] = 0x5a
	return b
}

// CloudOVA is a small OVA for a bed's image server: a tar of the
// descriptor ovf (an .ovf, which download-url's OVA check wants) and the
// monolithic sparse vmdk disk of virtual size size.
func CloudOVA(ovf, disk string, size uint64) ([]byte, error) {
	vmdk := make([]byte, 1024)
	copy(vmdk, vmdkMagic)
	binary.LittleEndian.PutUint32(vmdk[4:], 1)
	binary.LittleEndian.PutUint64(vmdk[12:], size/512)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range []struct {
		name string
		data []byte
	}{{ovf, []byte("<Envelope/>\n")}, {disk, vmdk}} {
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, fmt.Errorf("pveemu: ova: %w", err)
		}
		if _, err := tw.Write(m.data); err != nil {
			return nil, fmt.Errorf("pveemu: ova: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("pveemu: ova: %w", err)
	}
	return buf.Bytes(), nil
}
