package sandbox

import "context"

// TEMPORARY: replaced by the definitions of branch ctapi38 at merge.

// CTConfig is the configuration set on a fresh container clone.
type CTConfig struct {
	Tags      []string
	Hostname  string
	Cores     int
	MemoryMiB int
	Bridges   []string
	MACs      []string
}

// Containers is the part of the Proxmox API the engine needs for
// unprivileged containers.
type Containers interface {
	CTTemplateID(ctx context.Context, name string) (int, error)
	CloneCT(ctx context.Context, s CloneSpec) error
	ConfigureCT(ctx context.Context, vmid int, c CTConfig) error
	StartCT(ctx context.Context, vmid int) error
	StopCT(ctx context.Context, vmid int) error
	DeleteCT(ctx context.Context, vmid int) error
	CT(ctx context.Context, vmid int) (VMInfo, error)
	ListCTs(ctx context.Context) ([]VMInfo, error)
	CTConfigValues(ctx context.Context, vmid int) (map[string]string, error)
	SnapshotCT(ctx context.Context, vmid int, name string) error
	RollbackCT(ctx context.Context, vmid int, name string) error
}
