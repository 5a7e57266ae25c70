package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// APISection configures the sandbox API ([api]).
type APISection struct {
	// Enabled turns the sandbox API on.
	Enabled bool `toml:"enabled"`
	// Socket is the unix socket; SocketGroup (name or gid, "" keeps the
	// daemon's group) and SocketMode (octal string) restrict who may call.
	Socket      string `toml:"socket"`
	SocketGroup string `toml:"socket_group"`
	SocketMode  string `toml:"socket_mode"`
	// Listen, when set, is host:port of a TCP listener with TLS and bearer
	// tokens (the management address).
	Listen  string `toml:"listen"`
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
	// TokenFile holds the hashed bearer tokens.
	TokenFile string `toml:"token_file"`
	// StateDir holds the sandbox state file.
	StateDir string `toml:"state_dir"`
	// QGADir holds the guest agent sockets <vmid>.qga.
	QGADir string `toml:"qga_dir"`
	// Containers lets sandboxes have unprivileged containers (kind lxc)
	// as members; LXCPath is lxc's path (lxc-attach -P) and
	// ContainerCgroups the cgroup v2 directory holding each container's
	// cgroup <vmid> (pve-container's lxc.cgroup.dir.container lxc/<vmid>).
	Containers       bool   `toml:"containers"`
	LXCPath          string `toml:"lxc_path"`
	ContainerCgroups string `toml:"container_cgroups"`
	// Pool is the Proxmox pool of every sandbox VM.
	Pool string `toml:"pool"`
	// Templates maps template names to VM ids; other names are looked up
	// among the node's templates by name.
	Templates map[string]int `toml:"templates"`
	// DefaultTTL and MaxTTL bound sandbox lifetimes.
	DefaultTTL time.Duration `toml:"default_ttl"`
	MaxTTL     time.Duration `toml:"max_ttl"`
	// ReaperInterval is how often expired sandboxes are deleted.
	ReaperInterval time.Duration `toml:"reaper_interval"`
	// AgentTimeout bounds the wait for a started VM's guest agent.
	AgentTimeout time.Duration `toml:"agent_timeout"`
	// SDNApplyTimeout bounds the wait for one SDN apply (sandbox.Options
	// ApplyTimeout): an apply's time grows with every DHCP zone of the
	// cluster on every node.
	SDNApplyTimeout time.Duration `toml:"sdn_apply_timeout"`
	// HealthInterval is how often every ready sandbox's VMs are checked;
	// AgentBrokenAfter how long an agent may be silent before its VM is
	// broken (sandbox.HealthOptions).
	HealthInterval   time.Duration `toml:"health_interval"`
	AgentBrokenAfter time.Duration `toml:"agent_broken_after"`
	// MaxFileBytes caps file uploads and downloads.
	MaxFileBytes int64 `toml:"max_file_bytes"`
	// ExecSlots, FileSlots and CollectedBytes are the node's exec calls,
	// file calls and collected exec output in flight; OwnerExecSlots,
	// OwnerFileSlots and OwnerCollectedBytes each owner's share of them
	// (sandboxapi.Options).
	ExecSlots           int   `toml:"exec_slots"`
	FileSlots           int   `toml:"file_slots"`
	CollectedBytes      int64 `toml:"collected_bytes"`
	OwnerExecSlots      int   `toml:"owner_exec_slots"`
	OwnerFileSlots      int   `toml:"owner_file_slots"`
	OwnerCollectedBytes int64 `toml:"owner_collected_bytes"`
	// GuestBufferBytes bounds the guest agents' reply bytes the daemon
	// buffers at once across all VMs, OwnerGuestBufferBytes the part of
	// them for one owner's calls (qga.Budget).
	GuestBufferBytes      int64 `toml:"guest_buffer_bytes"`
	OwnerGuestBufferBytes int64 `toml:"owner_guest_buffer_bytes"`
	// DiskTransferStorage is the Proxmox storage for the disk path of
	// large files ("" = off); files of at least DiskTransferThreshold
	// bytes take it.
	DiskTransferStorage   string `toml:"disk_transfer_storage"`
	DiskTransferThreshold int64  `toml:"disk_transfer_threshold"`
	// VerifyBridges checks, after each SDN apply of a create or a pool
	// refill, that the sandbox's vnet bridges are on this node
	// (/sys/class/net) and applies again when one is missing (a reload
	// lost to another client's). Off only where the Proxmox node is not
	// this host (tests against an emulated node).
	VerifyBridges bool `toml:"verify_bridges"`
	// ExecOwnSession runs each plain exec as the leader of its own session
	// (through setsid: one more program exec per command) instead of
	// leaving it in the guest agent's process group (qga.Options).
	ExecOwnSession bool `toml:"exec_own_session"`
	// AutoCIDRPool and AutoCIDRBits: where "auto" networks come from.
	AutoCIDRPool string `toml:"auto_cidr_pool"`
	AutoCIDRBits int    `toml:"auto_cidr_bits"`
	// RequireHardenedTemplates refuses a create from a template that fails
	// the hardened VM profile's items a clone cannot fix (see
	// `pve-inspectd template check`). Off, the template items are
	// excused, never an OVMF template's firmware for a VM that does not
	// ask "uefi" (sandbox checkTemplates).
	RequireHardenedTemplates bool `toml:"require_hardened_templates"`
	// AllowUEFI lets a create ask for firmware "uefi" (OVMF: SMM emulation
	// on, a pflash device; hardening/doc.go). Default false.
	AllowUEFI bool `toml:"allow_uefi"`
	// AllowWindows lets a create ask for a Windows os_type (Hyper-V
	// enlightenments; no guest I/O through the daemon). Default false.
	AllowWindows bool `toml:"allow_windows"`
	// AllowE1000 lets a create ask for nic_controller "e1000" (QEMU's
	// emulated Intel NIC, for guests without virtio drivers: device code
	// virtio-net does not have; hardening/doc.go). Default false.
	AllowE1000 bool `toml:"allow_e1000"`
	// SharedVNets are Proxmox SDN vnets (by id) of zones the daemon did
	// not create that a sandbox's VMs may have NICs on (a NIC's vnet):
	// the operator's opt-in to VMs of different sandboxes meeting there
	// (README "Shared vnets"). Checked against Proxmox at start and at
	// every use (sandbox sharedvnets.go). Default none.
	SharedVNets []string `toml:"shared_vnets"`
	// MgmtRules and MgmtInterval are the keys' old place, kept so that
	// existing files still load: when set they override [guard] mgmt_rules
	// and mgmt_interval (Parse moves them there). Deprecated.
	MgmtRules    *bool   `toml:"mgmt_rules"`
	MgmtInterval *string `toml:"mgmt_interval"`
	// Caps are the resource guard's limits (0: unlimited).
	Caps APICaps `toml:"caps"`
	// Events caps the GET /v1/events streams ([api.events]).
	Events APIEvents `toml:"events"`
	// Proxmox is the API the daemon drives.
	Proxmox APIProxmox `toml:"proxmox"`
}

// APICaps are the guard's per-sandbox, node-wide and per-owner caps
// ([api.caps]; 0 = unlimited). An unset owner cap is a quarter of its node
// cap (sandbox.Caps.WithOwnerDefaults).
type APICaps struct {
	SandboxVCPUs     int `toml:"sandbox_vcpus"`
	SandboxMemoryMiB int `toml:"sandbox_memory_mib"`
	SandboxVMs       int `toml:"sandbox_vms"`
	NodeVCPUs        int `toml:"node_vcpus"`
	NodeMemoryMiB    int `toml:"node_memory_mib"`
	NodeVMs          int `toml:"node_vms"`
	NodeSandboxes    int `toml:"node_sandboxes"`
	OwnerVCPUs       int `toml:"owner_vcpus"`
	OwnerMemoryMiB   int `toml:"owner_memory_mib"`
	OwnerVMs         int `toml:"owner_vms"`
	OwnerSandboxes   int `toml:"owner_sandboxes"`
}

// APIEvents caps the event streams open at once ([api.events];
// sandboxapi.StreamLimits): per token, per owner (every token bound to it
// together; an unbound token is an owner of its own, and so is the local
// socket) and per node. A stream past a cap is refused with 429 and
// Retry-After. WriteTimeout bounds each write of a stream, and of an
// exec's or a file download's answer, and each read of an upload's body:
// a client that does not take (or send) it in time is cut off.
type APIEvents struct {
	MaxStreamsPerToken int           `toml:"max_streams_per_token"`
	MaxStreamsPerOwner int           `toml:"max_streams_per_owner"`
	MaxStreams         int           `toml:"max_streams"`
	WriteTimeout       time.Duration `toml:"write_timeout"`
}

// APIProxmox is the Proxmox API connection ([api.proxmox]).
type APIProxmox struct {
	// URL is the API base.
	URL string `toml:"url"`
	// Node is the Proxmox node name ("" = node.id).
	Node string `toml:"node"`
	// TokenID is "user@realm!name" of an API token limited to the pool;
	// the secret is read from SecretFile (the plain secret, or the JSON
	// `pveum user token add --output-format json` prints). "" means the
	// token the secret file names (pve-access-setup writes that JSON),
	// else pve-access-setup's default for the node,
	// pve-inspectd@pve!daemon-<node>.
	TokenID    string `toml:"token_id"`
	SecretFile string `toml:"secret_file"`
	// CAFile verifies the API certificate ("" = system pool).
	CAFile string `toml:"ca_file"`
}

// defaultAPI returns the [api] defaults.
func defaultAPI() APISection {
	return APISection{
		Enabled:               false,
		Socket:                "/run/pve-inspectd/api.sock",
		SocketMode:            "0660",
		TLSCert:               "/etc/pve/local/pve-ssl.pem",
		TLSKey:                "/etc/pve/local/pve-ssl.key",
		TokenFile:             "/etc/pve-inspectd/tokens.json",
		StateDir:              "/var/lib/pve-inspectd/sandboxapi",
		QGADir:                "/var/run/qemu-server",
		Containers:            false,
		LXCPath:               "/var/lib/lxc",
		ContainerCgroups:      "/sys/fs/cgroup/lxc",
		Pool:                  "pve-inspect",
		Templates:             map[string]int{},
		SharedVNets:           []string{},
		DefaultTTL:            time.Hour,
		MaxTTL:                24 * time.Hour,
		ReaperInterval:        30 * time.Second,
		AgentTimeout:          5 * time.Minute,
		SDNApplyTimeout:       30 * time.Minute,
		HealthInterval:        5 * time.Second,
		AgentBrokenAfter:      20 * time.Second,
		MaxFileBytes:          1 << 30,
		ExecSlots:             32,
		FileSlots:             8,
		CollectedBytes:        256 << 20,
		OwnerExecSlots:        8,
		OwnerFileSlots:        2,
		OwnerCollectedBytes:   64 << 20,
		GuestBufferBytes:      256 << 20,
		OwnerGuestBufferBytes: 64 << 20,
		DiskTransferThreshold: 32 << 20,
		VerifyBridges:         true,
		AutoCIDRPool:          "10.200.0.0/16",
		AutoCIDRBits:          24,

		RequireHardenedTemplates: true,
		// the egress node totals hold [egress] owners, derived from this
		// (48 + 16 zones the daemon did not create: 64)
		Caps:   APICaps{NodeSandboxes: 48},
		Events: APIEvents{MaxStreamsPerToken: 8, MaxStreamsPerOwner: 16, MaxStreams: 256, WriteTimeout: 30 * time.Second},
		Proxmox: APIProxmox{
			URL:        "https://127.0.0.1:8006/api2/json",
			SecretFile: "/etc/pve-inspectd/pve-token",
			CAFile:     "/etc/pve/pve-root-ca.pem",
		},
	}
}

// reTokenID is an API token's full id: user@realm!name, the name as
// pve-access-control's token_subid_regex allows.
var reTokenID = regexp.MustCompile(`^[^@!]+@[^@!]+![A-Za-z][A-Za-z0-9._-]+$`)

var reTemplateName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// SocketFileMode parses SocketMode.
func (a APISection) SocketFileMode() (uint32, error) {
	v, err := strconv.ParseUint(a.SocketMode, 8, 32)
	if err != nil || v > 0o777 {
		return 0, fmt.Errorf("want an octal mode such as 0660, got %q", a.SocketMode)
	}
	return uint32(v), nil
}

func (a APISection) validate(prefix string) error {
	key := func(k string, err error) error { return &KeyError{Key: prefix + "." + k, Err: err} }
	abs := func(k, v string, allowEmpty bool) error {
		if v == "" && allowEmpty {
			return nil
		}
		if !filepath.IsAbs(v) {
			return key(k, fmt.Errorf("want an absolute path, got %q", v))
		}
		return nil
	}
	for k, v := range map[string]string{"socket": a.Socket, "token_file": a.TokenFile, "state_dir": a.StateDir, "qga_dir": a.QGADir,
		"lxc_path": a.LXCPath, "container_cgroups": a.ContainerCgroups} {
		if err := abs(k, v, false); err != nil {
			return err
		}
	}
	if m, err := a.SocketFileMode(); err != nil {
		return key("socket_mode", err)
	} else if m&0o007 != 0 {
		return key("socket_mode", errors.New("must not grant access to others"))
	}
	if a.Listen != "" {
		host, port, err := net.SplitHostPort(a.Listen)
		if err != nil || port == "" {
			return key("listen", fmt.Errorf("want host:port, got %q", a.Listen))
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return key("listen", fmt.Errorf("bad port %q", port))
		}
		addr, err := netip.ParseAddr(host)
		switch {
		case host == "":
			return key("listen", errors.New("name the management address; a wildcard would expose the API on guest bridges"))
		case err != nil:
			return key("listen", fmt.Errorf("want an IP address of the management interface, got %q", host))
		case addr.Unmap().IsUnspecified():
			return key("listen", fmt.Errorf("%s is a wildcard: it would expose the API on guest bridges; name the management address", host))
		case addr.IsMulticast():
			return key("listen", fmt.Errorf("%s is a multicast address", host))
		}
		for k, v := range map[string]string{"tls_cert": a.TLSCert, "tls_key": a.TLSKey} {
			if err := abs(k, v, false); err != nil {
				return err
			}
		}
	}
	if a.Pool == "" {
		return key("pool", errors.New("must not be empty"))
	}
	for name, id := range a.Templates {
		if !reTemplateName.MatchString(name) {
			return key("templates."+name, errors.New("bad template name"))
		}
		if id < 100 || id > 999999999 {
			return key("templates."+name, fmt.Errorf("vmid %d out of range", id))
		}
	}
	durs := []struct {
		k string
		v time.Duration
	}{{"default_ttl", a.DefaultTTL}, {"max_ttl", a.MaxTTL}, {"reaper_interval", a.ReaperInterval}, {"agent_timeout", a.AgentTimeout},
		{"sdn_apply_timeout", a.SDNApplyTimeout},
		{"health_interval", a.HealthInterval}, {"agent_broken_after", a.AgentBrokenAfter}, {"events.write_timeout", a.Events.WriteTimeout}}
	for _, d := range durs {
		if d.v <= 0 {
			return key(d.k, errors.New("must be positive"))
		}
	}
	if a.DefaultTTL > a.MaxTTL {
		return key("default_ttl", errors.New("is over max_ttl"))
	}
	if a.MaxFileBytes < 1 {
		return key("max_file_bytes", errors.New("must be positive"))
	}
	for _, q := range []struct {
		k string
		v int64
	}{{"exec_slots", int64(a.ExecSlots)}, {"file_slots", int64(a.FileSlots)}, {"collected_bytes", a.CollectedBytes},
		{"owner_exec_slots", int64(a.OwnerExecSlots)}, {"owner_file_slots", int64(a.OwnerFileSlots)},
		{"owner_collected_bytes", a.OwnerCollectedBytes}, {"guest_buffer_bytes", a.GuestBufferBytes},
		{"owner_guest_buffer_bytes", a.OwnerGuestBufferBytes}} {
		if q.v < 1 {
			return key(q.k, errors.New("must be positive"))
		}
	}
	// an owner's share is a part of the node's total: a share past the
	// total would let one owner's calls be refused by the total alone
	for _, q := range []struct {
		owner, node string
		o, n        int64
	}{{"owner_exec_slots", "exec_slots", int64(a.OwnerExecSlots), int64(a.ExecSlots)},
		{"owner_file_slots", "file_slots", int64(a.OwnerFileSlots), int64(a.FileSlots)},
		{"owner_collected_bytes", "collected_bytes", a.OwnerCollectedBytes, a.CollectedBytes},
		{"owner_guest_buffer_bytes", "guest_buffer_bytes", a.OwnerGuestBufferBytes, a.GuestBufferBytes}} {
		if q.o > q.n {
			return key(q.owner, fmt.Errorf("%d is over %s (%d): an owner's share cannot exceed the node's total", q.o, q.node, q.n))
		}
	}
	if a.DiskTransferThreshold < 1 {
		return key("disk_transfer_threshold", errors.New("must be positive"))
	}
	if a.DiskTransferStorage != "" && !reStorageID.MatchString(a.DiskTransferStorage) {
		return key("disk_transfer_storage", fmt.Errorf("%q is not a Proxmox storage id", a.DiskTransferStorage))
	}
	p, err := netip.ParsePrefix(a.AutoCIDRPool)
	if err != nil || !p.Addr().Is4() || p.Masked() != p {
		return key("auto_cidr_pool", fmt.Errorf("want an IPv4 prefix, got %q", a.AutoCIDRPool))
	}
	if !sandbox.PrivateV4(p) {
		return key("auto_cidr_pool", fmt.Errorf("%s is not inside a private (RFC 1918) range", p))
	}
	if a.AutoCIDRBits < p.Bits() || a.AutoCIDRBits > 28 {
		return key("auto_cidr_bits", fmt.Errorf("want %d..28", p.Bits()))
	}
	caps := map[string]int{"sandbox_vcpus": a.Caps.SandboxVCPUs, "sandbox_memory_mib": a.Caps.SandboxMemoryMiB, "sandbox_vms": a.Caps.SandboxVMs,
		"node_vcpus": a.Caps.NodeVCPUs, "node_memory_mib": a.Caps.NodeMemoryMiB, "node_vms": a.Caps.NodeVMs, "node_sandboxes": a.Caps.NodeSandboxes,
		"owner_vcpus": a.Caps.OwnerVCPUs, "owner_memory_mib": a.Caps.OwnerMemoryMiB, "owner_vms": a.Caps.OwnerVMs, "owner_sandboxes": a.Caps.OwnerSandboxes}
	for k, v := range caps {
		if v < 0 {
			return key("caps."+k, errors.New("must not be negative"))
		}
	}
	for k, v := range map[string]int{"max_streams_per_token": a.Events.MaxStreamsPerToken, "max_streams_per_owner": a.Events.MaxStreamsPerOwner, "max_streams": a.Events.MaxStreams} {
		if v < 1 {
			return key("events."+k, errors.New("must be positive"))
		}
	}
	if a.Events.MaxStreamsPerToken > a.Events.MaxStreamsPerOwner || a.Events.MaxStreamsPerOwner > a.Events.MaxStreams {
		return key("events.max_streams_per_owner", errors.New("want max_streams_per_token <= max_streams_per_owner <= max_streams"))
	}
	if err := checkSharedVNets(prefix, a.SharedVNets); err != nil {
		return err
	}
	if a.Enabled {
		if a.Proxmox.URL == "" {
			return key("proxmox.url", errors.New("must not be empty"))
		}
		if a.Proxmox.TokenID != "" && !reTokenID.MatchString(a.Proxmox.TokenID) {
			return key("proxmox.token_id", fmt.Errorf("want user@realm!tokenname (an API token, never a password login), got %q", a.Proxmox.TokenID))
		}
		if err := abs("proxmox.secret_file", a.Proxmox.SecretFile, false); err != nil {
			return err
		}
	}
	return nil
}

// reVNetID is pve-network's vnet id format (VnetPlugin.pm
// pve-sdn-vnet-id: [a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9], 2 to 8 characters).
var reVNetID = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9]{0,6}[a-zA-Z0-9]$`)

// checkSharedVNets checks [api] shared_vnets on its own: vnet ids, none
// twice. What only Proxmox and the guard know (the vnet exists, its zone
// is not a sandbox's, it has a subnet, it is no management interface) is
// checked at start (Engine.CheckSharedVNets); a trusted interface by
// Config.Validate.
func checkSharedVNets(prefix string, vnets []string) error {
	seen := map[string]bool{}
	for i, v := range vnets {
		k := fmt.Sprintf("%s.shared_vnets[%d]", prefix, i)
		if !reVNetID.MatchString(v) {
			return &KeyError{Key: k, Err: fmt.Errorf("%q is not a Proxmox vnet id (a letter, then letters or digits, 2 to 8 in all)", v)}
		}
		if seen[v] {
			return &KeyError{Key: k, Err: fmt.Errorf("%s is listed twice", v)}
		}
		seen[v] = true
	}
	return nil
}

// reStorageID is pve-storage's storage id format (pve-storage-id).
var reStorageID = regexp.MustCompile(`^[a-z][a-z0-9\-_.]*[a-z0-9]$`)
