package pveemu

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/ulikunitz/xz"
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

// CloudRawTarXZ is a small cloud image archive as Kali publishes its own
// (kali-linux-...-cloud-genericcloud-amd64.tar.xz): a .tar.xz holding one
// member, disk.raw, a raw disk of size bytes (an MBR boot signature, the
// rest zeros). The bed's guests boot the host's root whatever the image.
func CloudRawTarXZ(size int64) ([]byte, error) {
	if size < 512 {
		return nil, fmt.Errorf("pveemu: raw disk of %d bytes: want at least one sector", size)
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	if err := tw.WriteHeader(&tar.Header{Name: "disk.raw", Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	sector := make([]byte, 512)
	sector[510], sector[511] = 0x55, 0xAA
	if _, err := tw.Write(sector); err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	if _, err := io.Copy(tw, io.LimitReader(zeros{}, size-512)); err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	var out bytes.Buffer
	zw, err := xz.NewWriter(&out)
	if err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	if _, err := zw.Write(tb.Bytes()); err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("pveemu: raw archive: %w", err)
	}
	return out.Bytes(), nil
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
