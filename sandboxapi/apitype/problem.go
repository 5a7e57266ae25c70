package apitype

import "fmt"

// Problem types: stable values of the "type" member of every error document.
const (
	ProblemInvalidRequest       = "invalid-request"
	ProblemNotFound             = "not-found"
	ProblemConflict             = "conflict"
	ProblemGuardRefused         = "guard-refused"
	ProblemGuestTimeout         = "guest-timeout"
	ProblemGuestUnavailable     = "guest-agent-unavailable"
	ProblemGuestProtocol        = "guest-agent-error"
	ProblemOutputLimit          = "output-limit"
	ProblemPayloadTooLarge      = "payload-too-large"
	ProblemFileNotFound         = "file-not-found"
	ProblemIsDirectory          = "is-a-directory"
	ProblemPermissionDenied     = "permission-denied"
	ProblemUnauthorized         = "unauthorized"
	ProblemForbidden            = "forbidden"
	ProblemMethodNotAllowed     = "method-not-allowed"
	ProblemUnsupportedMediaType = "unsupported-media-type"
	ProblemTimeout              = "timeout"
	ProblemProxmox              = "proxmox-error"
	ProblemUnavailable          = "unavailable"
	ProblemInternal             = "internal"
	ProblemGuestNoSpace         = "guest-no-space"
	ProblemTemplateNotHardened  = "template-not-hardened"
	// ProblemSandboxBroken: the VM's health is broken (stopped, panicked,
	// agent silent); the call was not tried. Reason carries the health
	// reason.
	ProblemSandboxBroken = "sandbox-broken"
	// ProblemTooManyRequests: a per-owner, per-token or node quota is
	// full (429 with Retry-After); the detail names the quota.
	ProblemTooManyRequests = "too-many-requests"
	// ProblemInsufficientStorage: a storage of the node has not the room
	// the call needs (507; an image upload for a template build): the
	// detail names the storage, what is needed and what is free; nothing
	// was written.
	ProblemInsufficientStorage = "insufficient-storage"
)

// Reasons of a conflict (Problem.Reason).
const (
	// ReasonExpired: the reaper deleted the sandbox at its expiry.
	ReasonExpired = "expired"
	// ReasonDeleted: a delete call deleted the sandbox.
	ReasonDeleted = "deleted"
	// ReasonCIDRInUse: a fixed CIDR of the create overlaps a range
	// another sandbox holds; the create may succeed once it is gone.
	ReasonCIDRInUse = "cidr-in-use"
)

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Cap names the guard cap a create would exceed (guard-refused only).
	Cap string `json:"cap,omitempty"`
	// Field names the request field that is invalid (invalid-request; a
	// conflict of reason cidr-in-use names the network's cidr).
	Field string `json:"field,omitempty"`
	// Items lists the failing profile items (template-not-hardened only).
	Items []string `json:"items,omitempty"`
	// Reason says why in a word: the health reason (sandbox-broken); for
	// a conflict, ReasonExpired or ReasonDeleted (the sandbox is being
	// deleted, or its delete ended the call; the detail says when it
	// expired or who deleted it) or ReasonCIDRInUse (a fixed CIDR
	// overlaps another sandbox's range; field names the network).
	Reason string `json:"reason,omitempty"`
	// Quota names the quota that refused the call before anything of it
	// ran (too-many-requests and unavailable with Retry-After:
	// exec-slots, file-slots, collected-bytes, events-streams), so that
	// retrying it after Retry-After cannot run anything twice. Absent
	// when the refusal came during the call (guest buffer bytes).
	Quota string `json:"quota,omitempty"`
}

// Error makes a Problem usable as an error (the client returns it).
func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%s: %s", p.Type, p.Detail)
	}
	return p.Type
}

// ProblemTypes lists every stable problem type (documented in the OpenAPI
// document).
func ProblemTypes() []string {
	return []string{ProblemInvalidRequest, ProblemNotFound, ProblemConflict, ProblemGuardRefused,
		ProblemGuestTimeout, ProblemGuestUnavailable, ProblemGuestProtocol, ProblemOutputLimit,
		ProblemPayloadTooLarge, ProblemFileNotFound, ProblemIsDirectory, ProblemPermissionDenied,
		ProblemUnauthorized, ProblemForbidden, ProblemMethodNotAllowed, ProblemUnsupportedMediaType,
		ProblemTimeout, ProblemProxmox, ProblemUnavailable, ProblemInternal, ProblemTemplateNotHardened,
		ProblemSandboxBroken, ProblemGuestNoSpace, ProblemTooManyRequests, ProblemInsufficientStorage}
}
