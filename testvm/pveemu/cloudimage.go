package pveemu

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"

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

// OVFDisk is a disk of an OVF descriptor (OVFDescriptor): its file in the
// archive and its virtual size in bytes.
type OVFDisk struct {
	File string
	Size uint64
}

// OVFDescriptor is an OVF 1.0 descriptor, in the shape VirtualBox and
// VMware export, of a VM name whose OS is the CIM_OperatingSystem id os
// (96: Debian 64-bit) with disks on one controller of bus (ide, scsi or
// sata: ResourceType 5, 6 or 20) at addresses 0, 1, ... and one e1000
// NIC, 1 CPU and 512 MB, BIOS firmware: the parts GuestImport/OVF.pm
// reads (OVF.Descriptor for others).
func OVFDescriptor(name string, os int, bus string, disks ...OVFDisk) string {
	return OVF{Name: name, OS: os, Bus: bus, Disks: disks}.Descriptor()
}

// OVF is the VM an OVF descriptor (Descriptor) describes: OVFDescriptor's
// with its CPUs (Processor's VirtualQuantity, 1 when 0), memory (Memory's
// VirtualQuantity in MegaBytes, 512 when 0) and, with EFI, VMware's
// firmware setting vmw:Config firmware=efi (OVF.pm's only firmware
// reading).
type OVF struct {
	Name      string
	OS        int
	Bus       string
	Disks     []OVFDisk
	CPUs      int
	MemoryMiB int
	EFI       bool
}

// Descriptor is the OVF 1.0 descriptor of o (see OVFDescriptor).
func (o OVF) Descriptor() string {
	name, os, bus, disks := o.Name, o.OS, o.Bus, o.Disks
	cpus, memory := max(o.CPUs, 1), o.MemoryMiB
	if memory == 0 {
		memory = 512
	}
	firmware := ""
	if o.EFI {
		firmware = "      <vmw:Config ovf:required=\"false\" vmw:key=\"firmware\" vmw:value=\"efi\"/>\n"
	}
	ctrl := map[string]int{"ide": 5, "scsi": 6, "sata": 20}[bus]
	var refs, sect, items strings.Builder
	for i, d := range disks {
		capacity, unit := d.Size, "byte * 2^0"
		if d.Size%(1<<30) == 0 {
			capacity, unit = d.Size>>30, "byte * 2^30"
		}
		fmt.Fprintf(&refs, "    <File ovf:id=\"file%d\" ovf:href=\"%s\"/>\n", i+1, d.File)
		fmt.Fprintf(&sect, "    <Disk ovf:capacity=\"%d\" ovf:capacityAllocationUnits=\"%s\" ovf:diskId=\"vmdisk%d\" ovf:fileRef=\"file%d\" ovf:format=\"http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized\"/>\n",
			capacity, unit, i+1, i+1)
		fmt.Fprintf(&items, "      <Item>\n        <rasd:AddressOnParent>%d</rasd:AddressOnParent>\n        <rasd:ElementName>disk%d</rasd:ElementName>\n"+
			"        <rasd:HostResource>/disk/vmdisk%d</rasd:HostResource>\n        <rasd:InstanceID>%d</rasd:InstanceID>\n"+
			"        <rasd:Parent>3</rasd:Parent>\n        <rasd:ResourceType>17</rasd:ResourceType>\n      </Item>\n", i, i+1, i+1, 10+i)
	}
	return fmt.Sprintf(`<?xml version="1.0"?>
<Envelope ovf:version="1.0" xml:lang="en-US" xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1" xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData" xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData" xmlns:vmw="http://www.vmware.com/schema/ovf">
  <References>
%s  </References>
  <DiskSection>
    <Info>List of the virtual disks used in the package</Info>
%s  </DiskSection>
  <VirtualSystem ovf:id="%s">
    <Info>A virtual machine</Info>
    <Name>%s</Name>
    <OperatingSystemSection ovf:id="%d">
      <Info>The kind of installed guest operating system</Info>
    </OperatingSystemSection>
    <VirtualHardwareSection>
      <Info>Virtual hardware requirements for a virtual machine</Info>
      <Item>
        <rasd:InstanceID>1</rasd:InstanceID>
        <rasd:ResourceType>3</rasd:ResourceType>
        <rasd:VirtualQuantity>%d</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:AllocationUnits>MegaBytes</rasd:AllocationUnits>
        <rasd:InstanceID>2</rasd:InstanceID>
        <rasd:ResourceType>4</rasd:ResourceType>
        <rasd:VirtualQuantity>%d</rasd:VirtualQuantity>
      </Item>
      <Item>
        <rasd:Address>0</rasd:Address>
        <rasd:InstanceID>3</rasd:InstanceID>
        <rasd:ResourceType>%d</rasd:ResourceType>
      </Item>
%s      <Item>
        <rasd:AutomaticAllocation>true</rasd:AutomaticAllocation>
        <rasd:Connection>NAT</rasd:Connection>
        <rasd:InstanceID>20</rasd:InstanceID>
        <rasd:ResourceSubType>E1000</rasd:ResourceSubType>
        <rasd:ResourceType>10</rasd:ResourceType>
      </Item>
%s    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>
`, refs.String(), sect.String(), name, name, os, cpus, memory, ctrl, items.String(), firmware)
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
