package kvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// NestedError explains why this host cannot run a Proxmox node with KVM.
type NestedError struct {
	Reason string
	Fix    string
}

func (e *NestedError) Error() string { return "nested virtualization: " + e.Reason + "; " + e.Fix }

// CheckNested reads /sys/module/kvm_{intel,amd}/parameters/nested under
// sysRoot ("/" normally) and /dev/kvm, and says what to do when nested
// virtualization is off.
func CheckNested(sysRoot string) error {
	found := false
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		b, err := os.ReadFile(filepath.Join(sysRoot, "sys/module", m, "parameters/nested"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("nested virtualization: %w", err)
		}
		found = true
		switch strings.TrimSpace(string(b)) {
		case "Y", "y", "1":
			if _, err := os.Stat(filepath.Join(sysRoot, "dev/kvm")); err != nil {
				return &NestedError{Reason: "/dev/kvm is missing", Fix: "load the " + m + " module and check the device's permissions"}
			}
			return nil
		default:
			return &NestedError{
				Reason: m + " is loaded with nested=" + strings.TrimSpace(string(b)),
				Fix: fmt.Sprintf("run `echo 'options %s nested=1' > /etc/modprobe.d/%s-nested.conf`, "+
					"stop all VMs, then `modprobe -r %s && modprobe %s`", m, m, m, m),
			}
		}
	}
	if !found {
		return &NestedError{Reason: "neither kvm_intel nor kvm_amd is loaded", Fix: "enable VT-x/AMD-V in firmware (or the cloud's nested virtualization option) and load the module"}
	}
	return nil
}
