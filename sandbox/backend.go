package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
)

// Errors the Proxmox implementation returns (wrapped) so the API can branch.
var (
	// ErrNotFound: the Proxmox object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: the Proxmox object (e.g. a VM id) already exists.
	ErrExists = errors.New("already exists")
)

// Errors a Guest returns (wrapped) so the API maps them to problem types.
var (
	// ErrGuestUnavailable: the agent socket is absent or the agent does not answer.
	ErrGuestUnavailable = errors.New("guest agent unavailable")
	// ErrGuestTimeout: the agent did not reply in time.
	ErrGuestTimeout = errors.New("guest agent timeout")
	// ErrGuestProtocol: the agent sent a malformed, oversized or unexpected reply.
	ErrGuestProtocol = errors.New("guest agent protocol error")
	// ErrFileNotFound: the guest path does not exist.
	ErrFileNotFound = errors.New("file not found in guest")
	// ErrIsDirectory: the guest path is a directory.
	ErrIsDirectory = errors.New("is a directory in guest")
	// ErrPermission: the guest refused access to the path.
	ErrPermission = errors.New("permission denied in guest")
	// ErrTooLarge: a guest file is larger than the cap passed to ReadFile.
	ErrTooLarge = errors.New("guest file larger than the cap")
	// ErrGuestNoSpace: writing in the guest failed for want of space.
	ErrGuestNoSpace = errors.New("no space left in guest")
	// ErrGuestInvalid: the guest agent client refused the request as
	// invalid before sending it (bad path, environment name, ...).
	ErrGuestInvalid = errors.New("invalid guest request")
)

// CloneSpec is a linked clone of a template into the daemon's pool.
type CloneSpec struct {
	Template int
	NewID    int
	Name     string
	Pool     string
}

// VMConfig is the configuration set on a fresh clone.
type VMConfig struct {
	// Tags are set as the VM's Proxmox tags (replacing the template's).
	Tags      []string
	Cores     int
	MemoryMiB int
	// Bridges are attached as net0, net1, ... (virtio, firewall off).
	Bridges []string
}

// VMInfo is what the daemon reads back about a VM.
type VMInfo struct {
	VMID   int
	Name   string
	Status string // "running", "stopped", ...
	Tags   []string
	Pool   string
	// Template is true for templates; they are never touched by cleanup.
	Template bool
}

// ZoneSpec is a simple SDN zone with the zone DHCP (dnsmasq) and PVE IPAM.
type ZoneSpec struct {
	ID string
}

// VNetSpec is a vnet in a zone; Alias carries the ownership tags.
type VNetSpec struct {
	ID    string
	Zone  string
	Alias string
}

// SubnetSpec is a subnet of a vnet.
type SubnetSpec struct {
	VNet      string
	CIDR      string
	Gateway   string
	SNAT      bool
	DHCPStart string // empty: no DHCP range
	DHCPEnd   string
}

// VNetInfo is a vnet as listed for reconcile.
type VNetInfo struct {
	ID    string
	Zone  string
	Alias string
}

// Proxmox is what the sandbox API needs from the Proxmox API. Every method
// waits for the task it starts and returns an error when the task fails.
// Implemented with go-proxmox by pveapi.
type Proxmox interface {
	// NextID returns a free VM id.
	NextID(ctx context.Context) (int, error)
	// TemplateID looks a template VM up by name (ErrNotFound when absent).
	TemplateID(ctx context.Context, name string) (int, error)
	CloneVM(ctx context.Context, s CloneSpec) error
	ConfigureVM(ctx context.Context, vmid int, c VMConfig) error
	// ResizeDisk grows the VM's boot disk to sizeGiB.
	ResizeDisk(ctx context.Context, vmid int, sizeGiB int) error
	StartVM(ctx context.Context, vmid int) error
	StopVM(ctx context.Context, vmid int) error
	// DeleteVM destroys the VM with purge (removes it from pools and jobs).
	DeleteVM(ctx context.Context, vmid int) error
	// VM returns the VM's status and tags (ErrNotFound when absent).
	VM(ctx context.Context, vmid int) (VMInfo, error)
	// ListVMs lists every VM of the node (for reconcile).
	ListVMs(ctx context.Context) ([]VMInfo, error)
	Snapshot(ctx context.Context, vmid int, name string) error
	Rollback(ctx context.Context, vmid int, name string) error

	CreateZone(ctx context.Context, z ZoneSpec) error
	DeleteZone(ctx context.Context, id string) error
	CreateVNet(ctx context.Context, v VNetSpec) error
	DeleteVNet(ctx context.Context, id string) error
	CreateSubnet(ctx context.Context, s SubnetSpec) error
	DeleteSubnet(ctx context.Context, vnet, cidr string) error
	// ListVNets lists every vnet (for reconcile and free-range selection).
	ListVNets(ctx context.Context) ([]VNetInfo, error)
	// ListSubnetCIDRs lists the CIDRs of every subnet in the cluster.
	ListSubnetCIDRs(ctx context.Context) ([]string, error)
	// VNetSubnets lists the CIDRs of one vnet's subnets.
	VNetSubnets(ctx context.Context, vnet string) ([]string, error)
	// ApplySDN applies pending SDN changes (PUT /cluster/sdn).
	ApplySDN(ctx context.Context) error
	// EnsurePool creates the pool when it does not exist.
	EnsurePool(ctx context.Context, pool string) error
}

// GuestExec is what a guest runs; the guest agent client's request type is
// adapted to it by the wiring.
type GuestExec struct {
	Argv    []string
	Stdin   []byte
	Cwd     string
	Env     map[string]string
	User    string
	Timeout int64 // seconds
	// OutputLimit caps each stream; the result says which was truncated.
	OutputLimit int64
}

// Guest is one VM's guest agent. Implemented by the guest agent client
// (qga) through an adapter; errors wrap the Err* guest sentinels.
type Guest interface {
	Ping(ctx context.Context) error
	Exec(ctx context.Context, r GuestExec) (*ExecResult, error)
	// ExecStream copies output to the writers while the command runs and
	// returns the final result (its Stdout/Stderr may be empty).
	ExecStream(ctx context.Context, r GuestExec, stdout, stderr io.Writer) (*ExecResult, error)
	WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error
	// ReadFile copies the file to w and fails with ErrTooLarge (wrapped)
	// once more than max bytes would be copied.
	ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error)
}

// GuestDialer returns the Guest behind an agent socket path
// (<QGADir>/<vmid>.qga).
type GuestDialer func(socketPath string) Guest

// CheckTarget is what the containment check needs to know about a sandbox.
type CheckTarget struct {
	Sandbox Sandbox
	VM      VM
	Guest   Guest
	// Others are the other ready sandboxes of this node (cross-zone probes).
	Others []Sandbox
	// GuestOf returns the guest of any VM of this node by VM id (to learn
	// another sandbox's guest address).
	GuestOf func(vmid int) Guest
}

// Checker runs the containment check (DESIGN.md section 7) from inside a VM.
// Implemented by containment through an adapter.
type Checker interface {
	Run(ctx context.Context, t CheckTarget) (CheckReport, error)
}
