package pveemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Sandbox node defaults: what the daemon's configuration and
// pve-access-setup expect on a node.
const (
	SandboxPool     = "pve-inspect"
	SandboxStorage  = "local-lvm"
	SandboxTemplate = "debian"
	SandboxNet0     = "virtio=BC:24:11:00:00:01,bridge=vmbr0"
)

// AddSandboxTemplate prepares s as an operator and pve-access-setup
// prepare a node for the sandbox API: the template SandboxTemplate as VM
// vmid on the disk directory diskDir (created with the /var/tmp a guest
// needs), the pool SandboxPool, and the template's storage in the pool
// (so that the pool's ACL reaches /storage/local-lvm, as pve-access-setup
// arranges).
func (s *Server) AddSandboxTemplate(ctx context.Context, vmid int, diskDir, poolComment string) error {
	if err := os.MkdirAll(filepath.Join(diskDir, "upper", "var", "tmp"), 0o755); err != nil {
		return fmt.Errorf("template disk: %w", err)
	}
	if err := s.AddTemplate(ctx, vmid, SandboxTemplate, diskDir, map[string]string{"net0": SandboxNet0}); err != nil {
		return fmt.Errorf("template %d: %w", vmid, err)
	}
	if err := s.AddPool(SandboxPool, poolComment); err != nil {
		return fmt.Errorf("pool %s: %w", SandboxPool, err)
	}
	if err := s.AddPoolStorage(SandboxPool, SandboxStorage); err != nil {
		return fmt.Errorf("pool %s storage %s: %w", SandboxPool, SandboxStorage, err)
	}
	return nil
}
