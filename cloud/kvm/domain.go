package kvm

import (
	"crypto/rand"
	"encoding/xml"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"
)

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// ValidName reports whether s can name a nested node (its domain, volumes
// and host name).
func ValidName(s string) bool { return nameRe.MatchString(s) }

// MetadataURI is the XML namespace of the tag pve-bootstrap puts in the
// <metadata> of every domain it made; list finds its nodes by it.
const MetadataURI = "https://github.com/pve-inspect/pve-inspect/nested/1"

// metadataPrefix is the namespace prefix libvirt stores the tag under.
const metadataPrefix = "pvenested"

// NodeMeta is the tag in a node's domain metadata.
type NodeMeta struct {
	XMLName    xml.Name  `xml:"node"`
	InstanceID string    `xml:"instance-id"`
	Network    string    `xml:"network"`
	Address    string    `xml:"address"`
	MAC        string    `xml:"mac"`
	Created    time.Time `xml:"created"`
	ClonedFrom string    `xml:"cloned-from,omitempty"`
}

// maxMeta bounds the metadata read back from libvirt.
const maxMeta = 16 << 10

// ParseNodeMeta reads the tag as libvirt's GetMetadata returns it and checks every field,
// since any client of the same libvirtd can write a domain's metadata.
func ParseNodeMeta(s string) (NodeMeta, error) {
	if len(s) > maxMeta {
		return NodeMeta{}, fmt.Errorf("node metadata: %d bytes, want at most %d", len(s), maxMeta)
	}
	var m NodeMeta
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return NodeMeta{}, fmt.Errorf("node metadata: %w", err)
	}
	// libvirt hands the element back without its namespace (it was asked
	// for by namespace); a namespaced one must be ours.
	if m.XMLName.Local != "node" || (m.XMLName.Space != "" && m.XMLName.Space != MetadataURI) {
		return NodeMeta{}, fmt.Errorf("node metadata: element %q in %q, want node in %s", m.XMLName.Local, m.XMLName.Space, MetadataURI)
	}
	if !validInstanceID(m.InstanceID) {
		return NodeMeta{}, fmt.Errorf("node metadata: instance id %q", m.InstanceID)
	}
	if !validNetName(m.Network) {
		return NodeMeta{}, fmt.Errorf("node metadata: network %q", m.Network)
	}
	if a, err := netip.ParseAddr(m.Address); err != nil || !a.Is4() {
		return NodeMeta{}, fmt.Errorf("node metadata: address %q: want IPv4", m.Address)
	}
	if !validMAC(m.MAC) {
		return NodeMeta{}, fmt.Errorf("node metadata: mac %q", m.MAC)
	}
	if m.ClonedFrom != "" && !ValidName(m.ClonedFrom) {
		return NodeMeta{}, fmt.Errorf("node metadata: cloned-from %q", m.ClonedFrom)
	}
	return m, nil
}

// xml renders the tag as it goes into <metadata> (libvirt wants the
// namespace declared on the element).
func (m NodeMeta) xml() (string, error) {
	m.XMLName = xml.Name{}
	b, err := xml.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("node metadata: %w", err)
	}
	inner, ok1 := strings.CutPrefix(string(b), "<node>")
	inner, ok2 := strings.CutSuffix(inner, "</node>")
	if !ok1 || !ok2 {
		return "", fmt.Errorf("node metadata: unexpected encoding %q", b)
	}
	return "<" + metadataPrefix + ":node xmlns:" + metadataPrefix + "=\"" + MetadataURI + "\">" + inner + "</" + metadataPrefix + ":node>", nil
}

func validInstanceID(s string) bool {
	i := strings.LastIndexByte(s, '-')
	return i > 0 && ValidName(s[:i]) && len(s)-i-1 == 12 && strings.Trim(s[i+1:], "0123456789abcdef") == ""
}

func validNetName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

func validMAC(s string) bool {
	if len(s) != 17 {
		return false
	}
	for i, r := range s {
		if i%3 == 2 {
			if r != ':' {
				return false
			}
		} else if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// newMAC returns a random address in QEMU's locally administered prefix.
func newMAC() (string, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2]), nil
}

// DomainSpec is everything a node's domain XML is made from.
type DomainSpec struct {
	Name      string
	CPUs      int
	MemoryMiB int
	// Accel is "kvm" (domain type kvm, host-passthrough CPU so the node
	// can run its own guests) or "tcg" (domain type qemu, emulated).
	Accel string
	// Pool holds the node's volumes: Disk (qcow2) and Seed (raw ISO).
	Pool, Disk, Seed string
	Network          string
	MAC              string
	// SerialLog is the file the serial console is copied to.
	SerialLog string
	Meta      NodeMeta
	// Kernel, Initrd and Cmdline boot a kernel directly (tests).
	Kernel, Initrd, Cmdline string
}

func (s DomainSpec) check() error {
	if !ValidName(s.Name) {
		return fmt.Errorf("domain: name %q: want lowercase letters, digits and dashes (max 32)", s.Name)
	}
	if s.CPUs < 1 || s.CPUs > 256 || s.MemoryMiB < 256 {
		return fmt.Errorf("domain %s: %d CPUs, %d MiB: want 1-256 CPUs and at least 256 MiB", s.Name, s.CPUs, s.MemoryMiB)
	}
	if s.Accel != "kvm" && s.Accel != "tcg" {
		return fmt.Errorf("domain %s: accel %q: want kvm or tcg", s.Name, s.Accel)
	}
	if !validNetName(s.Network) || !validNetName(s.Pool) {
		return fmt.Errorf("domain %s: network %q, pool %q: want letters, digits, '-', '_', '.'", s.Name, s.Network, s.Pool)
	}
	if !validMAC(s.MAC) {
		return fmt.Errorf("domain %s: mac %q", s.Name, s.MAC)
	}
	if s.SerialLog == "" || !filepath.IsAbs(s.SerialLog) {
		return fmt.Errorf("domain %s: serial log %q: want an absolute path", s.Name, s.SerialLog)
	}
	return nil
}

// Domain builds the node's libvirt domain.
func (s DomainSpec) Domain() (*libvirtxml.Domain, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	meta, err := s.Meta.xml()
	if err != nil {
		return nil, err
	}
	typ, cpu := "kvm", &libvirtxml.DomainCPU{Mode: "host-passthrough", Check: "none", Migratable: "off"}
	if s.Accel == "tcg" {
		typ, cpu = "qemu", &libvirtxml.DomainCPU{Mode: "maximum"}
	}
	port := uint(0)
	d := &libvirtxml.Domain{
		Type:     typ,
		Name:     s.Name,
		Title:    "Proxmox VE node (pve-bootstrap nested)",
		Metadata: &libvirtxml.DomainMetadata{XML: meta},
		Memory:   &libvirtxml.DomainMemory{Value: uint(s.MemoryMiB), Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: uint(s.CPUs)},
		OS: &libvirtxml.DomainOS{
			Type:        &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
			BootDevices: []libvirtxml.DomainBootDevice{{Dev: "hd"}},
			Kernel:      s.Kernel, Initrd: s.Initrd, Cmdline: s.Cmdline,
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		CPU:        cpu,
		OnPoweroff: "destroy", OnReboot: "restart", OnCrash: "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				volumeDisk(s.Pool, s.Disk, "qcow2", "vda", false),
				volumeDisk(s.Pool, s.Seed, "raw", "vdb", true),
			},
			Interfaces: []libvirtxml.DomainInterface{{
				MAC:    &libvirtxml.DomainInterfaceMAC{Address: s.MAC},
				Source: &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: s.Network}},
				Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
			}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: &port},
				Log:    &libvirtxml.DomainChardevLog{File: s.SerialLog, Append: "on"},
			}},
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port},
			}},
			RNGs: []libvirtxml.DomainRNG{{
				Model:   "virtio",
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
			}},
		},
	}
	return d, nil
}

func volumeDisk(pool, vol, format, dev string, readOnly bool) libvirtxml.DomainDisk {
	d := libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format, Discard: "unmap"},
		Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: pool, Volume: vol}},
		Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: "virtio"},
	}
	if readOnly {
		d.Driver.Discard = ""
		d.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	}
	return d
}

// NetworkSpec is the NAT network nodes sit on.
type NetworkSpec struct {
	Name   string
	Bridge string
	// Subnet is an IPv4 /16 to /28; the host takes its first address,
	// reserved node addresses come from the lower half and DHCP leases
	// from the upper half.
	Subnet netip.Prefix
}

// ErrSubnet is a subnet a NAT network cannot be made from.
var ErrSubnet = errors.New("subnet: want an IPv4 network address with a prefix from /16 to /28")

// reservedRange is the part of the subnet node addresses are reserved in:
// from the second host address to the last address of the lower half.
func reservedRange(p netip.Prefix) (first, last netip.Addr) {
	base := p.Masked().Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	size := uint32(1) << (32 - p.Bits())
	return u32Addr(n + 2), u32Addr(n + size/2 - 1)
}

func u32Addr(n uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// Network builds the network's XML.
func (s NetworkSpec) Network() (*libvirtxml.Network, error) {
	p := s.Subnet
	if !p.IsValid() || !p.Addr().Is4() || p.Bits() < 16 || p.Bits() > 28 || p.Masked() != p {
		return nil, fmt.Errorf("network %s: %s: %w", s.Name, p, ErrSubnet)
	}
	if !validNetName(s.Name) || len(s.Bridge) == 0 || len(s.Bridge) > 15 || !validNetName(s.Bridge) {
		return nil, fmt.Errorf("network %q, bridge %q: want letters, digits, '-', '_', '.' (bridge at most 15)", s.Name, s.Bridge)
	}
	n := addrU32(p.Addr())
	size := uint32(1) << (32 - p.Bits())
	return &libvirtxml.Network{
		Name:    s.Name,
		Forward: &libvirtxml.NetworkForward{Mode: "nat"},
		Bridge:  &libvirtxml.NetworkBridge{Name: s.Bridge, STP: "on", Delay: "0"},
		IPs: []libvirtxml.NetworkIP{{
			Address: u32Addr(n + 1).String(),
			Netmask: u32Addr(^uint32(0) << (32 - p.Bits())).String(),
			DHCP: &libvirtxml.NetworkDHCP{Ranges: []libvirtxml.NetworkDHCPRange{{
				Start: u32Addr(n + size/2).String(), End: u32Addr(n + size - 2).String(),
			}}},
		}},
	}, nil
}

// PoolXML is a directory storage pool at dir.
func PoolXML(name, dir string) (*libvirtxml.StoragePool, error) {
	if !validNetName(name) || !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("pool %q at %q: want a plain name and an absolute directory", name, dir)
	}
	return &libvirtxml.StoragePool{Type: "dir", Name: name, Target: &libvirtxml.StoragePoolTarget{Path: filepath.Clean(dir)}}, nil
}

// overlayXML is a qcow2 volume of capGiB on top of the base volume's path.
func overlayXML(name, basePath string, capGiB int) *libvirtxml.StorageVolume {
	return &libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "GiB", Value: uint64(capGiB)},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
		BackingStore: &libvirtxml.StorageVolumeBackingStore{
			Path: basePath, Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"},
		},
	}
}

// plainVolXML is a volume of size bytes in format ("raw", "qcow2").
func plainVolXML(name, format string, size int64) *libvirtxml.StorageVolume {
	return &libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: uint64(size)},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}},
	}
}

// volName names a node's volumes.
func diskVol(node string) string { return node + ".qcow2" }
func seedVol(node string) string { return node + "-seed.iso" }

// apiURL is the node's Proxmox API.
func apiURL(addr string) string { return "https://" + addr + ":" + strconv.Itoa(8006) + "/" }
