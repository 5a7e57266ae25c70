package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Problem types: stable values of the "type" member of every error document.
const (
	ProblemInvalidRequest        = "invalid-request"
	ProblemNotFound              = "not-found"
	ProblemConflict              = "conflict"
	ProblemGuardRefused          = "guard-refused"
	ProblemGuestTimeout          = "guest-timeout"
	ProblemGuestUnavailable      = "guest-agent-unavailable"
	ProblemGuestProtocol         = "guest-agent-error"
	ProblemOutputLimit           = "output-limit"
	ProblemPayloadTooLarge       = "payload-too-large"
	ProblemFileNotFound          = "file-not-found"
	ProblemIsDirectory           = "is-a-directory"
	ProblemPermissionDenied      = "permission-denied"
	ProblemUnauthorized          = "unauthorized"
	ProblemForbidden             = "forbidden"
	ProblemMethodNotAllowed      = "method-not-allowed"
	ProblemUnsupportedMediaType  = "unsupported-media-type"
	ProblemTimeout               = "timeout"
	ProblemProxmox               = "proxmox-error"
	ProblemUnavailable           = "unavailable"
	ProblemInternal              = "internal"
	ProblemGuestNoSpace          = "guest-no-space"
	ProblemTemplateNotHardened   = "template-not-hardened"
	problemContentType           = "application/problem+json"
	problemDefaultStatusInternal = http.StatusInternalServerError
)

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Cap names the guard cap a create would exceed (guard-refused only).
	Cap string `json:"cap,omitempty"`
	// Field names the request field that is invalid (invalid-request only).
	Field string `json:"field,omitempty"`
	// Items lists the failing profile items (template-not-hardened only).
	Items []string `json:"items,omitempty"`
}

// Error makes a Problem usable as an error (the client returns it).
func (p *Problem) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%s: %s", p.Type, p.Detail)
	}
	return p.Type
}

var problemTitles = map[string]string{
	ProblemInvalidRequest:       "Invalid request",
	ProblemNotFound:             "Not found",
	ProblemConflict:             "Conflict",
	ProblemGuardRefused:         "Refused by the resource guard",
	ProblemGuestTimeout:         "Guest agent timed out",
	ProblemGuestUnavailable:     "Guest agent unavailable",
	ProblemGuestProtocol:        "Guest agent misbehaved",
	ProblemOutputLimit:          "Output over the limit",
	ProblemPayloadTooLarge:      "Request body too large",
	ProblemFileNotFound:         "File not found in guest",
	ProblemIsDirectory:          "Path is a directory in guest",
	ProblemPermissionDenied:     "Permission denied in guest",
	ProblemUnauthorized:         "Unauthorized",
	ProblemForbidden:            "Forbidden",
	ProblemMethodNotAllowed:     "Method not allowed",
	ProblemUnsupportedMediaType: "Unsupported media type",
	ProblemTimeout:              "Deadline exceeded",
	ProblemProxmox:              "Proxmox API error",
	ProblemUnavailable:          "Service unavailable",
	ProblemInternal:             "Internal error",
	ProblemGuestNoSpace:         "No space left in guest",
	ProblemTemplateNotHardened:  "Template not hardened",
}

var problemStatus = map[string]int{
	ProblemInvalidRequest:       http.StatusBadRequest,
	ProblemNotFound:             http.StatusNotFound,
	ProblemConflict:             http.StatusConflict,
	ProblemGuardRefused:         http.StatusTooManyRequests,
	ProblemGuestTimeout:         http.StatusGatewayTimeout,
	ProblemGuestUnavailable:     http.StatusBadGateway,
	ProblemGuestProtocol:        http.StatusBadGateway,
	ProblemOutputLimit:          http.StatusRequestEntityTooLarge,
	ProblemPayloadTooLarge:      http.StatusRequestEntityTooLarge,
	ProblemFileNotFound:         http.StatusNotFound,
	ProblemIsDirectory:          http.StatusConflict,
	ProblemPermissionDenied:     http.StatusForbidden,
	ProblemUnauthorized:         http.StatusUnauthorized,
	ProblemForbidden:            http.StatusForbidden,
	ProblemMethodNotAllowed:     http.StatusMethodNotAllowed,
	ProblemUnsupportedMediaType: http.StatusUnsupportedMediaType,
	ProblemTimeout:              http.StatusGatewayTimeout,
	ProblemProxmox:              http.StatusBadGateway,
	ProblemUnavailable:          http.StatusServiceUnavailable,
	ProblemInternal:             problemDefaultStatusInternal,
	ProblemGuestNoSpace:         http.StatusInsufficientStorage,
	ProblemTemplateNotHardened:  http.StatusUnprocessableEntity,
}

// ProblemTypes lists every stable problem type (documented in the OpenAPI
// document).
func ProblemTypes() []string {
	return []string{ProblemInvalidRequest, ProblemNotFound, ProblemConflict, ProblemGuardRefused,
		ProblemGuestTimeout, ProblemGuestUnavailable, ProblemGuestProtocol, ProblemOutputLimit,
		ProblemPayloadTooLarge, ProblemFileNotFound, ProblemIsDirectory, ProblemPermissionDenied,
		ProblemUnauthorized, ProblemForbidden, ProblemMethodNotAllowed, ProblemUnsupportedMediaType,
		ProblemTimeout, ProblemProxmox, ProblemUnavailable, ProblemInternal, ProblemTemplateNotHardened}
}

// newProblem builds a problem of a known type.
func newProblem(typ, detail string) *Problem {
	st, ok := problemStatus[typ]
	if !ok {
		st = problemDefaultStatusInternal
	}
	return &Problem{Type: typ, Title: problemTitles[typ], Status: st, Detail: detail}
}

// problemf builds a problem with a formatted detail.
func problemf(typ, format string, a ...any) *Problem {
	return newProblem(typ, fmt.Sprintf(format, a...))
}

// asProblem maps any error to a problem document.
func asProblem(err error) *Problem {
	var p *Problem
	switch {
	case errors.As(err, &p):
		return p
	case errors.Is(err, ErrGuestInvalid):
		return newProblem(ProblemInvalidRequest, err.Error())
	case errors.Is(err, ErrTooLarge):
		return newProblem(ProblemOutputLimit, err.Error())
	case errors.Is(err, ErrFileNotFound):
		return newProblem(ProblemFileNotFound, err.Error())
	case errors.Is(err, ErrIsDirectory):
		return newProblem(ProblemIsDirectory, err.Error())
	case errors.Is(err, ErrPermission):
		return newProblem(ProblemPermissionDenied, err.Error())
	case errors.Is(err, ErrGuestNoSpace):
		return newProblem(ProblemGuestNoSpace, err.Error())
	case errors.Is(err, ErrGuestTimeout):
		return newProblem(ProblemGuestTimeout, err.Error())
	case errors.Is(err, ErrGuestUnavailable):
		return newProblem(ProblemGuestUnavailable, err.Error())
	case errors.Is(err, ErrGuestProtocol):
		return newProblem(ProblemGuestProtocol, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return newProblem(ProblemTimeout, err.Error())
	case errors.Is(err, ErrNotFound):
		return newProblem(ProblemNotFound, err.Error())
	case errors.Is(err, ErrExists):
		return newProblem(ProblemConflict, err.Error())
	}
	var pe *proxmoxError
	if errors.As(err, &pe) {
		return newProblem(ProblemProxmox, err.Error())
	}
	return newProblem(ProblemInternal, err.Error())
}

// proxmoxError marks an error that came from the Proxmox side.
type proxmoxError struct{ err error }

func (e *proxmoxError) Error() string { return e.err.Error() }
func (e *proxmoxError) Unwrap() error { return e.err }

// pxErr wraps a Proxmox call's error with the operation.
func pxErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return &proxmoxError{fmt.Errorf("%s: %w", op, err)}
}

// writeProblem sends a problem document.
func writeProblem(w http.ResponseWriter, p *Problem) {
	w.Header().Set("Content-Type", problemContentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// Unavailable is a handler that answers every request with the
// `unavailable` problem (503) and the given detail: what the daemon serves
// while the API cannot work yet (Proxmox unreachable, reconcile pending).
func Unavailable(detail string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "5")
		writeProblem(w, newProblem(ProblemUnavailable, detail))
	})
}
