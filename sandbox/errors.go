package sandbox

import (
	"errors"
	"fmt"
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

// Errors the engine returns (wrapped, see refusal) when it refuses a call;
// the HTTP layer maps each to a problem type (sandboxapi/problem.go).
var (
	// ErrUnknown: no sandbox of that id, or no VM of that name in it.
	ErrUnknown = errors.New("unknown sandbox or VM")
	// ErrConflict: the sandbox's state, or the ranges in use, forbid the
	// call (a sandbox that is not ready, a CIDR that overlaps).
	ErrConflict = errors.New("conflict")
	// ErrNoFreeRange: the auto CIDR pool has no free range left (a refusal
	// of the resource guard).
	ErrNoFreeRange = errors.New("no free range")
	// ErrNotConfigured: the part the call needs (containment check, egress
	// policies) is not enabled on this node.
	ErrNotConfigured = errors.New("not configured")
	// ErrBusy: a node-wide budget the call needs (the buffered guest
	// bytes of every VM) is used up by other calls; retry later.
	ErrBusy = errors.New("busy")
	// ErrOwnerBusy: the call's owner has used up its share of such a
	// budget with its other calls in flight; retry when one ends.
	ErrOwnerBusy = errors.New("owner's share in use")
	// ErrStorageFull: a storage of the node has not the room the call
	// needs (an image upload: pveproxy's spool and Proxmox's copy of it);
	// nothing was written.
	ErrStorageFull = errors.New("not enough room on the node's storage")
)

// refusal is a sentinel with a message of its own: errors.Is finds the
// sentinel, Error says only the message (what the caller is told).
type refusal struct {
	kind error
	msg  string
}

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return e.kind }

// refuse builds a refusal of kind with a formatted message.
func refuse(kind error, format string, a ...any) error {
	return &refusal{kind: kind, msg: fmt.Sprintf(format, a...)}
}

// GoneError refuses a call on a sandbox that is being deleted, or that
// its delete ended: Reason says why in a word (apitype.ReasonExpired,
// apitype.ReasonDeleted),
// Error in a sentence (when it expired, who deleted it). It is a conflict
// (errors.Is ErrConflict).
type GoneError struct {
	Reason string
	Msg    string
}

func (e *GoneError) Error() string { return e.Msg }
func (e *GoneError) Unwrap() error { return ErrConflict }

// goneWhy is why a sandbox is being deleted, kept in its record from the
// moment it turns to deleting (and gone with the record).
type goneWhy struct {
	reason string // apitype.ReasonExpired, apitype.ReasonDeleted
	why    string // "it expired at ...", "it was deleted by ..."
}

// refusal is the GoneError of a call on sandbox id: what happened (a
// sentence about the sandbox) and why; g nil says no why.
func (g *goneWhy) refusal(id, what string) error {
	if g == nil {
		return refuse(ErrConflict, "sandbox %s %s", id, what)
	}
	return &GoneError{Reason: g.reason, Msg: fmt.Sprintf("sandbox %s %s: %s", id, what, g.why)}
}

// RangeInUseError refuses a network whose fixed CIDR overlaps a range in
// use by another sandbox (of this node or another of the cluster): a
// conflict that ends when that sandbox goes. Index is the network's in the
// request.
type RangeInUseError struct {
	Index int
	Msg   string
}

func (e *RangeInUseError) Error() string { return e.Msg }
func (e *RangeInUseError) Unwrap() error { return ErrConflict }

// CapError is a create the resource guard refuses: it would pass Cap.
type CapError struct {
	// Cap is the cap's name as configured ("node_vcpus", ...).
	Cap string
	// Need is what the node or sandbox would hold with the create; Limit
	// the cap.
	Need, Limit int
}

func (e *CapError) Error() string {
	return fmt.Sprintf("cap %s: the create would need %d, the cap is %d", e.Cap, e.Need, e.Limit)
}

// InvalidError is a request the engine refuses as invalid (an unknown
// template, an egress policy the egress part rejects); Field names the
// request field.
type InvalidError struct {
	Field string
	Msg   string
}

func (e *InvalidError) Error() string { return e.Msg }

// invalid builds an InvalidError naming the field.
func invalid(field, format string, a ...any) error {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// NotHardenedError refuses a create from templates that fail the hardened
// VM profile in ways a clone cannot fix; Items lists the failing items.
type NotHardenedError struct {
	Items []string
	Msg   string
}

func (e *NotHardenedError) Error() string { return e.Msg }

// ProxmoxError is a failed Proxmox call, wrapped with the operation.
type ProxmoxError struct {
	Op  string
	Err error
}

func (e *ProxmoxError) Error() string { return e.Op + ": " + e.Err.Error() }
func (e *ProxmoxError) Unwrap() error { return e.Err }

// pxErr wraps a Proxmox call's error with the operation (nil stays nil).
func pxErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return &ProxmoxError{Op: op, Err: err}
}
