package qga

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors for expected outcomes that callers branch on. They are
// matched with errors.Is; the returned errors wrap them with the path and the
// agent's own message.
var (
	// ErrNotFound: the guest path (or one of its directories) does not exist.
	ErrNotFound = errors.New("no such file or directory")
	// ErrIsDir: the guest path is a directory where a file was expected.
	ErrIsDir = errors.New("is a directory")
	// ErrPermission: the guest refused access to the path.
	ErrPermission = errors.New("permission denied")
	// ErrTooLarge: a guest file is larger than the limit the caller gave.
	ErrTooLarge = errors.New("file larger than the limit")
	// ErrInvalid: the request itself is malformed (empty argv, relative
	// path, NUL byte, bad env name, ...): nothing was sent to the guest;
	// or the guest's kernel refused the path as such (too long, a loop of
	// symbolic links, an invalid argument), an *AgentError matching it.
	ErrInvalid = errors.New("invalid request")
	// ErrFrozen: the agent refused the command because the guest's file
	// systems are frozen (a snapshot or backup with fsfreeze runs): retry
	// once it ends. QEMU's qemu-ga disables every command but guest-ping,
	// guest-info, guest-sync, guest-sync-delimited, guest-fsfreeze-status
	// and guest-fsfreeze-thaw while frozen (qga/main.c ga_set_frozen,
	// ga_command_is_allowed), and qapi/qmp-dispatch.c answers a disabled
	// command CommandNotFound "Command <name> has been disabled: <reason>".
	ErrFrozen = errors.New("guest file systems frozen")
)

// frozenReasons are qemu-ga's reasons for a command disabled by the
// frozen state: "the agent is in frozen state" up to QEMU 9.0
// (ga_disable_not_allowed_freeze), "the command is not allowed" since
// (ga_apply_command_filters_iter; the same text as a command outside
// the guest's --allow-rpcs, which the daemon's templates do not set).
var frozenReasons = []string{"the agent is in frozen state", "the command is not allowed"}

// frozenAllowed are the commands qemu-ga still runs while frozen.
var frozenAllowed = map[string]bool{"guest-ping": true, "guest-info": true, "guest-sync": true,
	"guest-sync-delimited": true, "guest-fsfreeze-status": true, "guest-fsfreeze-thaw": true}

// isFrozenRefusal says whether an agent error is qemu-ga's refusal of a
// command disabled while the guest's file systems are frozen.
func isFrozenRefusal(e *AgentError) bool {
	if e.Class != "CommandNotFound" || frozenAllowed[e.Command] || !strings.Contains(e.Desc, " has been disabled: ") {
		return false
	}
	for _, r := range frozenReasons {
		if strings.HasSuffix(e.Desc, r) {
			return true
		}
	}
	return false
}

// Kind classifies a protocol failure: the agent (or whatever answers on its
// socket) broke the protocol, stalled or went away.
type Kind string

// Protocol failure kinds.
const (
	KindConnect     Kind = "connect"     // the socket could not be connected
	KindClosed      Kind = "closed"      // the agent closed the connection (or the connection failed) mid-call
	KindTimeout     Kind = "timeout"     // no reply (or no progress in the reply) before the deadline
	KindTooLarge    Kind = "too-large"   // a reply line exceeded the size bound
	KindMalformed   Kind = "malformed"   // a reply was not the strict JSON shape expected
	KindWrongID     Kind = "wrong-id"    // a reply carried an id that was not the one sent
	KindUnsolicited Kind = "unsolicited" // a reply answered no command we sent (no id, or garbage before the sync)
)

// ProtocolError is returned when the agent's channel misbehaves. The
// connection it happened on is closed; the client stays usable for the next
// call and for every other VM.
type ProtocolError struct {
	Kind    Kind   // what went wrong
	Command string // the guest agent command in flight ("guest-sync-delimited", "guest-file-read", ...)
	Socket  string // the agent socket
	Err     error  // underlying cause, may be nil
}

func (e *ProtocolError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "qga %s: %s", e.Socket, e.Kind)
	if e.Command != "" {
		fmt.Fprintf(&b, " during %s", e.Command)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *ProtocolError) Unwrap() error { return e.Err }

// AgentError is an error reply of the agent itself ({"error": {...}}): the
// protocol worked, the command failed.
type AgentError struct {
	Command string // the command that failed
	Class   string // QMP error class, e.g. "GenericError"
	Desc    string // human readable description from the agent (untrusted text)
}

func (e *AgentError) Error() string {
	return fmt.Sprintf("qga %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Is maps the agent's strerror text to the package sentinels so that
// errors.Is(err, ErrNotFound) works on agent replies.
func (e *AgentError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return strings.Contains(e.Desc, "No such file or directory") || strings.Contains(e.Desc, "Not a directory") ||
			strings.Contains(e.Desc, winNotFoundFile) || strings.Contains(e.Desc, winNotFoundPath)
	case ErrIsDir:
		return strings.Contains(e.Desc, "Is a directory")
	case ErrPermission:
		return strings.Contains(e.Desc, "Permission denied") || strings.Contains(e.Desc, "Operation not permitted") ||
			strings.Contains(e.Desc, "Read-only file system") || strings.Contains(e.Desc, winAccessDenied)
	case ErrFrozen:
		return isFrozenRefusal(e)
	case ErrInvalid:
		// a path the guest's kernel refuses as such: the caller's to fix
		return strings.Contains(e.Desc, "File name too long") || strings.Contains(e.Desc, "Invalid argument") ||
			strings.Contains(e.Desc, "Too many levels of symbolic links") || strings.Contains(e.Desc, winBadName)
	}
	return false
}

// PathError records a failed file operation on a guest path. Err is the
// underlying error (often an *AgentError, matching ErrNotFound and friends).
type PathError struct {
	Op   string // "read", "write"
	Path string // guest path
	Err  error
}

func (e *PathError) Error() string { return "qga " + e.Op + " " + e.Path + ": " + e.Err.Error() }

func (e *PathError) Unwrap() error { return e.Err }

// ErrorKind names the class of an error from this package, for metric
// labels ("guest agent errors by kind"): a ProtocolError's Kind, "agent"
// for an AgentError, "invalid" for ErrInvalid, "canceled" or
// "deadline" for the caller's context, "" for nil and "other" otherwise.
func ErrorKind(err error) string {
	var pe *ProtocolError
	var ae *AgentError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &pe):
		return string(pe.Kind)
	case errors.As(err, &ae):
		return "agent"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "other"
}
