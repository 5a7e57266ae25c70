package sandboxapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

const (
	problemContentType           = "application/problem+json"
	problemDefaultStatusInternal = http.StatusInternalServerError
)

var problemTitles = map[string]string{
	apitype.ProblemInvalidRequest:       "Invalid request",
	apitype.ProblemNotFound:             "Not found",
	apitype.ProblemConflict:             "Conflict",
	apitype.ProblemGuardRefused:         "Refused by the resource guard",
	apitype.ProblemGuestTimeout:         "Guest agent timed out",
	apitype.ProblemGuestUnavailable:     "Guest agent unavailable",
	apitype.ProblemGuestProtocol:        "Guest agent misbehaved",
	apitype.ProblemOutputLimit:          "Output over the limit",
	apitype.ProblemPayloadTooLarge:      "Request body too large",
	apitype.ProblemFileNotFound:         "File not found in guest",
	apitype.ProblemIsDirectory:          "Path is a directory in guest",
	apitype.ProblemPermissionDenied:     "Permission denied in guest",
	apitype.ProblemUnauthorized:         "Unauthorized",
	apitype.ProblemForbidden:            "Forbidden",
	apitype.ProblemMethodNotAllowed:     "Method not allowed",
	apitype.ProblemUnsupportedMediaType: "Unsupported media type",
	apitype.ProblemTimeout:              "Deadline exceeded",
	apitype.ProblemProxmox:              "Proxmox API error",
	apitype.ProblemUnavailable:          "Service unavailable",
	apitype.ProblemInternal:             "Internal error",
	apitype.ProblemGuestNoSpace:         "No space left in guest",
	apitype.ProblemTemplateNotHardened:  "Template not hardened",
	apitype.ProblemSandboxBroken:        "Sandbox broken",
	apitype.ProblemTooManyRequests:      "Too many requests",
	apitype.ProblemInsufficientStorage:  "Insufficient storage",
}

var problemStatus = map[string]int{
	apitype.ProblemInvalidRequest:       http.StatusBadRequest,
	apitype.ProblemNotFound:             http.StatusNotFound,
	apitype.ProblemConflict:             http.StatusConflict,
	apitype.ProblemGuardRefused:         http.StatusTooManyRequests,
	apitype.ProblemGuestTimeout:         http.StatusGatewayTimeout,
	apitype.ProblemGuestUnavailable:     http.StatusBadGateway,
	apitype.ProblemGuestProtocol:        http.StatusBadGateway,
	apitype.ProblemOutputLimit:          http.StatusRequestEntityTooLarge,
	apitype.ProblemPayloadTooLarge:      http.StatusRequestEntityTooLarge,
	apitype.ProblemFileNotFound:         http.StatusNotFound,
	apitype.ProblemIsDirectory:          http.StatusConflict,
	apitype.ProblemPermissionDenied:     http.StatusForbidden,
	apitype.ProblemUnauthorized:         http.StatusUnauthorized,
	apitype.ProblemForbidden:            http.StatusForbidden,
	apitype.ProblemMethodNotAllowed:     http.StatusMethodNotAllowed,
	apitype.ProblemUnsupportedMediaType: http.StatusUnsupportedMediaType,
	apitype.ProblemTimeout:              http.StatusGatewayTimeout,
	apitype.ProblemProxmox:              http.StatusBadGateway,
	apitype.ProblemUnavailable:          http.StatusServiceUnavailable,
	apitype.ProblemInternal:             problemDefaultStatusInternal,
	apitype.ProblemGuestNoSpace:         http.StatusInsufficientStorage,
	apitype.ProblemTemplateNotHardened:  http.StatusUnprocessableEntity,
	apitype.ProblemSandboxBroken:        http.StatusConflict,
	apitype.ProblemTooManyRequests:      http.StatusTooManyRequests,
	apitype.ProblemInsufficientStorage:  http.StatusInsufficientStorage,
}

// newProblem builds a problem of a known type.
func newProblem(typ, detail string) *apitype.Problem {
	st, ok := problemStatus[typ]
	if !ok {
		st = problemDefaultStatusInternal
	}
	return &apitype.Problem{Type: typ, Title: problemTitles[typ], Status: st, Detail: detail}
}

// problemf builds a problem with a formatted detail.
func problemf(typ, format string, a ...any) *apitype.Problem {
	return newProblem(typ, fmt.Sprintf(format, a...))
}

// asProblem maps any error to a problem document: the one place where the
// engine's sentinels and typed errors (package sandbox) become problem
// types and HTTP statuses. The HTTP layer's own refusals are problems
// already.
func asProblem(err error) *apitype.Problem {
	var (
		p   *apitype.Problem
		ce  *sandbox.CapError
		ie  *sandbox.InvalidError
		nhe *sandbox.NotHardenedError
		be  *sandbox.BrokenError
		ge  *sandbox.GoneError
		re  *sandbox.RangeInUseError
	)
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &ce):
		p := newProblem(apitype.ProblemGuardRefused, err.Error())
		p.Cap = ce.Cap
		return p
	case errors.As(err, &ie):
		p := newProblem(apitype.ProblemInvalidRequest, err.Error())
		p.Field = ie.Field
		return p
	case errors.As(err, &be):
		p := newProblem(apitype.ProblemSandboxBroken, err.Error())
		p.Reason = be.Reason
		return p
	case errors.As(err, &ge):
		p := newProblem(apitype.ProblemConflict, err.Error())
		p.Reason = ge.Reason
		return p
	case errors.As(err, &re):
		p := newProblem(apitype.ProblemConflict, err.Error())
		p.Reason = apitype.ReasonCIDRInUse
		p.Field = fmt.Sprintf("networks[%d].cidr", re.Index)
		return p
	case errors.As(err, &nhe):
		p := newProblem(apitype.ProblemTemplateNotHardened, err.Error())
		p.Items = nhe.Items
		return p
	case errors.Is(err, sandbox.ErrUnknown):
		return newProblem(apitype.ProblemNotFound, err.Error())
	case errors.Is(err, sandbox.ErrConflict):
		return newProblem(apitype.ProblemConflict, err.Error())
	case errors.Is(err, sandbox.ErrNoFreeRange):
		return newProblem(apitype.ProblemGuardRefused, err.Error())
	case errors.Is(err, sandbox.ErrNotConfigured), errors.Is(err, sandbox.ErrBusy):
		return newProblem(apitype.ProblemUnavailable, err.Error())
	case errors.Is(err, sandbox.ErrOwnerBusy):
		return newProblem(apitype.ProblemTooManyRequests, err.Error())
	case errors.Is(err, sandbox.ErrGuestInvalid):
		return newProblem(apitype.ProblemInvalidRequest, err.Error())
	case errors.Is(err, sandbox.ErrTooLarge):
		return newProblem(apitype.ProblemOutputLimit, err.Error())
	case errors.Is(err, sandbox.ErrFileNotFound):
		return newProblem(apitype.ProblemFileNotFound, err.Error())
	case errors.Is(err, sandbox.ErrIsDirectory):
		return newProblem(apitype.ProblemIsDirectory, err.Error())
	case errors.Is(err, sandbox.ErrPermission):
		return newProblem(apitype.ProblemPermissionDenied, err.Error())
	case errors.Is(err, sandbox.ErrGuestNoSpace):
		return newProblem(apitype.ProblemGuestNoSpace, err.Error())
	case errors.Is(err, sandbox.ErrStorageFull):
		return newProblem(apitype.ProblemInsufficientStorage, err.Error())
	case errors.Is(err, sandbox.ErrGuestTimeout):
		return newProblem(apitype.ProblemGuestTimeout, err.Error())
	case errors.Is(err, sandbox.ErrGuestUnavailable):
		return newProblem(apitype.ProblemGuestUnavailable, err.Error())
	case errors.Is(err, sandbox.ErrGuestProtocol):
		return newProblem(apitype.ProblemGuestProtocol, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return newProblem(apitype.ProblemTimeout, err.Error())
	case errors.Is(err, sandbox.ErrNotFound):
		return newProblem(apitype.ProblemNotFound, err.Error())
	case errors.Is(err, sandbox.ErrExists):
		return newProblem(apitype.ProblemConflict, err.Error())
	}
	var pe *sandbox.ProxmoxError
	if errors.As(err, &pe) {
		return newProblem(apitype.ProblemProxmox, err.Error())
	}
	return newProblem(apitype.ProblemInternal, err.Error())
}

// writeProblem sends a problem document.
func writeProblem(w http.ResponseWriter, p *apitype.Problem) {
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
		writeProblem(w, newProblem(apitype.ProblemUnavailable, detail))
	})
}
