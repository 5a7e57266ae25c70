package apitype

import "time"

// Health states of a sandbox and of each of its VMs (GET
// /v1/sandboxes/{id}, the health object). A sandbox is as healthy as its
// least healthy VM.
const (
	// HealthOK: every signal is within bounds.
	HealthOK = "ok"
	// HealthDegraded: the VM runs and answers, but something is wrong
	// (a guest process was killed for memory, a full disk, a slow agent);
	// calls still run.
	HealthDegraded = "degraded"
	// HealthBroken: the VM cannot serve calls (stopped, panicked, agent
	// silent); exec and file calls fail at once with sandbox-broken.
	HealthBroken = "broken"
)

// Health reasons: the stable values of SandboxHealth.Reason and
// VMHealth.Reason. Host-side signals come first; a reason from what the
// guest itself reports says so in its name (guest-...).
const (
	// ReasonVMStopped: Proxmox says the VM is not running (it should).
	ReasonVMStopped = "vm-stopped"
	// ReasonVMMissing: Proxmox no longer knows the VM.
	ReasonVMMissing = "vm-missing"
	// ReasonGuestPanicked: QMP status guest-panicked (the pvepanic device
	// of the hardened profile reported a guest kernel panic).
	ReasonGuestPanicked = "guest-panicked"
	// ReasonInternalError: QMP status internal-error (the emulator stopped
	// the guest).
	ReasonInternalError = "internal-error"
	// ReasonVMPaused: QMP status paused, suspended or another non-running
	// state while Proxmox says running.
	ReasonVMPaused = "vm-paused"
	// ReasonAgentUnresponsive: the guest agent has not answered a ping for
	// longer than the broken threshold.
	ReasonAgentUnresponsive = "agent-unresponsive"
	// ReasonAgentSlow: the last pings failed, but for less than the broken
	// threshold.
	ReasonAgentSlow = "agent-slow"
	// ReasonOOMKill: the VM's cgroup on the node counted an OOM kill since
	// the sandbox was created.
	ReasonOOMKill = "oom-kill"
	// ReasonGuestDiskFull: the guest agent reports a filesystem at or
	// above the full threshold (guest-reported).
	ReasonGuestDiskFull = "guest-disk-full"
)

// SandboxHealth is a sandbox's health: its worst VM's state and reason,
// and since when the sandbox is in that state.
type SandboxHealth struct {
	State string `json:"state"`
	// Reason is one of the Reason* values (empty when ok).
	Reason string `json:"reason,omitempty"`
	// Detail says the reason in a sentence, naming the VM.
	Detail string `json:"detail,omitempty"`
	// Since is when the sandbox entered State.
	Since time.Time `json:"since"`
	// CheckedAt is the last time every VM was checked.
	CheckedAt time.Time  `json:"checked_at"`
	VMs       []VMHealth `json:"vms,omitempty"`
}

// VMHealth is one VM's health and the signals it is derived from.
type VMHealth struct {
	Name   string    `json:"name"`
	VMID   int       `json:"vmid"`
	State  string    `json:"state"`
	Reason string    `json:"reason,omitempty"`
	Detail string    `json:"detail,omitempty"`
	Since  time.Time `json:"since"`
	// Host are the signals read on the node: what the guest cannot forge.
	Host HostSignals `json:"host"`
	// GuestReported is what the guest agent says of the guest: a hostile
	// guest can lie here, so it never turns a VM broken on its own.
	GuestReported *GuestReport `json:"guest_reported,omitempty"`
}

// HostSignals are a member's health signals read on the node (Proxmox,
// QMP, the agent socket, the VM's cgroup qemu.slice/<vmid>.scope and its
// tap devices; for a container: no QMP, the daemon entering it in place
// of the agent, its cgroup lxc/<vmid> and its veths). A zero counter may
// mean "not readable on this node"; Missing lists the sources that could
// not be read.
type HostSignals struct {
	// Status is Proxmox's status (running, stopped); QMPStatus QEMU's own
	// run state (running, paused, guest-panicked, internal-error, ...).
	Status    string `json:"status,omitempty"`
	QMPStatus string `json:"qmp_status,omitempty"`
	// NoAgent is true for a VM created without a guest agent (agent
	// false): it is not pinged, AgentOK stays false and no agent signal
	// counts against it (nor the agent series of the metrics).
	NoAgent bool `json:"no_agent,omitempty"`
	// AgentOK is whether the last ping was answered; AgentRTTSeconds its
	// round trip; LastAgentAnswer when the agent last answered.
	AgentOK         bool       `json:"agent_ok"`
	AgentRTTSeconds float64    `json:"agent_rtt_seconds,omitempty"`
	LastAgentAnswer *time.Time `json:"last_agent_answer,omitempty"`
	// SecondsSinceAgentAnswer counts from LastAgentAnswer (or from the
	// sandbox's start when it never answered a health ping).
	SecondsSinceAgentAnswer float64 `json:"seconds_since_agent_answer"`
	CPUSeconds              float64 `json:"cpu_seconds"`
	MemoryBytes             uint64  `json:"memory_bytes"`
	MemoryPeakBytes         uint64  `json:"memory_peak_bytes"`
	OOMKills                uint64  `json:"oom_kills"`
	DiskReadBytes           uint64  `json:"disk_read_bytes"`
	DiskWriteBytes          uint64  `json:"disk_write_bytes"`
	// Network counters of the VM's tap devices (a container's veths),
	// seen from the guest: To is what the node delivered to the guest,
	// From what the guest sent.
	NetBytesToGuest     uint64 `json:"net_bytes_to_guest"`
	NetBytesFromGuest   uint64 `json:"net_bytes_from_guest"`
	NetPacketsToGuest   uint64 `json:"net_packets_to_guest"`
	NetPacketsFromGuest uint64 `json:"net_packets_from_guest"`
	// Missing names the sources not readable in the last check
	// ("cgroup", "taps", "veths", "proxmox").
	Missing []string `json:"missing,omitempty"`
}

// GuestReport is what the guest agent reports of the guest itself.
type GuestReport struct {
	Filesystems []GuestFilesystem `json:"filesystems,omitempty"`
	// Error is set when the agent did not answer the report's query.
	Error string `json:"error,omitempty"`
}

// GuestFilesystem is one mounted filesystem as the agent reports it
// (guest-get-fsinfo).
type GuestFilesystem struct {
	Mountpoint string `json:"mountpoint"`
	Type       string `json:"type"`
	UsedBytes  uint64 `json:"used_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
}
