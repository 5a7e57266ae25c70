package kvm

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// Forward is a user-mode network host forward (TCP).
type Forward struct {
	// Name says what the port is for ("proxmox-api", "sandbox-api").
	Name      string `json:"name"`
	HostAddr  string `json:"host_addr"`
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
}

// VMSpec is everything the QEMU command line is made from.
type VMSpec struct {
	Name      string
	Disk      string // qcow2 image
	Seed      string // NoCloud seed ISO
	CPUs      int
	MemoryMiB int
	// Accel is "kvm" (with the host's CPU model) or "tcg" (tests; CPU
	// model "max").
	Accel     string
	Forwards  []Forward
	SerialLog string
	PIDFile   string
	QMPSocket string
	Daemonize bool
	// Kernel, Initrd and Append boot a kernel directly (tests).
	Kernel, Initrd, Append string
}

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// ValidName reports whether s can name a nested node (also its host name).
func ValidName(s string) bool { return nameRe.MatchString(s) }

func noComma(field, v string) error {
	if v == "" || strings.ContainsAny(v, ",\n") {
		return fmt.Errorf("qemu: %s %q: empty or contains a comma", field, v)
	}
	return nil
}

// Args returns QEMU's argv (without the binary).
func (s VMSpec) Args() ([]string, error) {
	if !ValidName(s.Name) {
		return nil, fmt.Errorf("qemu: name %q: want lowercase letters, digits and dashes", s.Name)
	}
	for f, v := range map[string]string{"disk": s.Disk, "seed": s.Seed} {
		if err := noComma(f, v); err != nil {
			return nil, err
		}
	}
	if s.CPUs < 1 || s.MemoryMiB < 256 {
		return nil, fmt.Errorf("qemu: %d CPUs, %d MiB: want at least 1 CPU and 256 MiB", s.CPUs, s.MemoryMiB)
	}
	cpu := ""
	switch s.Accel {
	case "kvm":
		cpu = "host"
	case "tcg":
		cpu = "max"
	default:
		return nil, fmt.Errorf("qemu: accel %q: want kvm or tcg", s.Accel)
	}
	nic := "user,model=virtio-net-pci,ipv6=off"
	seen := map[int]bool{}
	for _, f := range s.Forwards {
		a, err := netip.ParseAddr(f.HostAddr)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("qemu: forward %s: host address %q: want IPv4", f.Name, f.HostAddr)
		}
		if f.HostPort < 1 || f.HostPort > 65535 || f.GuestPort < 1 || f.GuestPort > 65535 {
			return nil, fmt.Errorf("qemu: forward %s: ports %d->%d out of range", f.Name, f.HostPort, f.GuestPort)
		}
		if seen[f.HostPort] {
			return nil, fmt.Errorf("qemu: forward %s: host port %d used twice", f.Name, f.HostPort)
		}
		seen[f.HostPort] = true
		nic += fmt.Sprintf(",hostfwd=tcp:%s:%d-:%d", a, f.HostPort, f.GuestPort)
	}
	args := []string{
		"-name", s.Name,
		"-machine", "q35",
		"-accel", s.Accel,
		"-cpu", cpu,
		"-smp", strconv.Itoa(s.CPUs),
		"-m", strconv.Itoa(s.MemoryMiB),
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-drive", "file=" + s.Disk + ",if=virtio,format=qcow2,discard=unmap",
		"-drive", "file=" + s.Seed + ",if=virtio,format=raw,readonly=on",
		"-nic", nic,
	}
	if s.SerialLog != "" {
		if err := noComma("serial log", s.SerialLog); err != nil {
			return nil, err
		}
		args = append(args, "-serial", "file:"+s.SerialLog)
	}
	if s.QMPSocket != "" {
		if err := noComma("qmp socket", s.QMPSocket); err != nil {
			return nil, err
		}
		args = append(args, "-qmp", "unix:"+s.QMPSocket+",server=on,wait=off")
	}
	if s.PIDFile != "" {
		args = append(args, "-pidfile", s.PIDFile)
	}
	if s.Kernel != "" {
		args = append(args, "-kernel", s.Kernel)
		if s.Initrd != "" {
			args = append(args, "-initrd", s.Initrd)
		}
		if s.Append != "" {
			args = append(args, "-append", s.Append)
		}
	}
	if s.Daemonize {
		args = append(args, "-daemonize")
	}
	return args, nil
}
