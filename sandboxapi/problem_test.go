package sandboxapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestAsProblem: every sentinel and typed error of the engine becomes its
// problem type and HTTP status here, wrapped or not, with the error's
// message as the detail and the typed error's extra member (field, cap,
// items) carried over.
func TestAsProblem(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("vm vm0: %w", err) }
	for _, tc := range []struct {
		err    error
		typ    string
		status int
		check  func(*apitype.Problem) bool
	}{
		{&sandbox.CapError{Cap: "node_vms", Need: 3, Limit: 2}, apitype.ProblemGuardRefused, http.StatusTooManyRequests, func(p *apitype.Problem) bool {
			return p.Cap == "node_vms" && p.Detail == "cap node_vms: the create would need 3, the cap is 2"
		}},
		{&sandbox.InvalidError{Field: "template", Msg: `unknown template "x"`}, apitype.ProblemInvalidRequest, http.StatusBadRequest, func(p *apitype.Problem) bool {
			return p.Field == "template" && p.Detail == `unknown template "x"`
		}},
		{&sandbox.NotHardenedError{Items: []string{"a", "b"}, Msg: "2 profile item(s) fail"}, apitype.ProblemTemplateNotHardened, http.StatusUnprocessableEntity, func(p *apitype.Problem) bool {
			return slices.Equal(p.Items, []string{"a", "b"}) && p.Detail == "2 profile item(s) fail"
		}},
		{fmt.Errorf("sandbox x: %w", sandbox.ErrUnknown), apitype.ProblemNotFound, http.StatusNotFound, nil},
		{fmt.Errorf("sandbox x is creating: %w", sandbox.ErrConflict), apitype.ProblemConflict, http.StatusConflict, nil},
		{wrap(&sandbox.GoneError{Reason: apitype.ReasonExpired, Msg: "sandbox x was deleted during the call: it expired at T"}), apitype.ProblemConflict, http.StatusConflict, func(p *apitype.Problem) bool {
			return p.Reason == apitype.ReasonExpired && p.Detail == "vm vm0: sandbox x was deleted during the call: it expired at T"
		}},
		{&sandbox.RangeInUseError{Index: 1, Msg: "network \"lab\": cidr 10.9.0.0/24 overlaps a range in use by another sandbox"}, apitype.ProblemConflict, http.StatusConflict, func(p *apitype.Problem) bool {
			return p.Reason == apitype.ReasonCIDRInUse && p.Field == "networks[1].cidr" && strings.HasPrefix(p.Detail, "network \"lab\"")
		}},
		{sandbox.ErrNoFreeRange, apitype.ProblemGuardRefused, http.StatusTooManyRequests, nil},
		{wrap(sandbox.ErrNotConfigured), apitype.ProblemUnavailable, http.StatusServiceUnavailable, nil},
		{wrap(sandbox.ErrBusy), apitype.ProblemUnavailable, http.StatusServiceUnavailable, nil},
		{wrap(sandbox.ErrOwnerBusy), apitype.ProblemTooManyRequests, http.StatusTooManyRequests, nil},
		{wrap(sandbox.ErrGuestInvalid), apitype.ProblemInvalidRequest, http.StatusBadRequest, nil},
		{wrap(sandbox.ErrTooLarge), apitype.ProblemOutputLimit, http.StatusRequestEntityTooLarge, nil},
		{wrap(sandbox.ErrFileNotFound), apitype.ProblemFileNotFound, http.StatusNotFound, nil},
		{wrap(sandbox.ErrIsDirectory), apitype.ProblemIsDirectory, http.StatusConflict, nil},
		{wrap(sandbox.ErrPermission), apitype.ProblemPermissionDenied, http.StatusForbidden, nil},
		{wrap(sandbox.ErrGuestNoSpace), apitype.ProblemGuestNoSpace, http.StatusInsufficientStorage, nil},
		{wrap(sandbox.ErrStorageFull), apitype.ProblemInsufficientStorage, http.StatusInsufficientStorage, nil},
		{wrap(sandbox.ErrGuestTimeout), apitype.ProblemGuestTimeout, http.StatusGatewayTimeout, nil},
		{wrap(sandbox.ErrGuestUnavailable), apitype.ProblemGuestUnavailable, http.StatusBadGateway, nil},
		{wrap(sandbox.ErrGuestProtocol), apitype.ProblemGuestProtocol, http.StatusBadGateway, nil},
		{wrap(context.DeadlineExceeded), apitype.ProblemTimeout, http.StatusGatewayTimeout, nil},
		{wrap(sandbox.ErrNotFound), apitype.ProblemNotFound, http.StatusNotFound, nil},
		{wrap(sandbox.ErrExists), apitype.ProblemConflict, http.StatusConflict, nil},
		{wrap(&sandbox.ProxmoxError{Op: "clone", Err: errors.New("500 boom")}), apitype.ProblemProxmox, http.StatusBadGateway, func(p *apitype.Problem) bool {
			return p.Detail == "vm vm0: clone: 500 boom"
		}},
		{wrap(problemf(apitype.ProblemPayloadTooLarge, "body too large")), apitype.ProblemPayloadTooLarge, http.StatusRequestEntityTooLarge, func(p *apitype.Problem) bool {
			return p.Detail == "body too large"
		}},
		{errors.New("something else"), apitype.ProblemInternal, http.StatusInternalServerError, nil},
	} {
		p := asProblem(tc.err)
		if p.Type != tc.typ || p.Status != tc.status || p.Title == "" {
			t.Errorf("asProblem(%v) = %s %d %q, want %s %d", tc.err, p.Type, p.Status, p.Title, tc.typ, tc.status)
		}
		if tc.check == nil && p.Detail != tc.err.Error() {
			t.Errorf("asProblem(%v): detail %q, want the error's message", tc.err, p.Detail)
		}
		if tc.check != nil && !tc.check(p) {
			t.Errorf("asProblem(%v) = %+v: extra members or detail wrong", tc.err, p)
		}
	}
}

// TestProblemTypesComplete: every problem type the API can answer (each
// with a title and a status here) is listed by apitype.ProblemTypes, which
// is the OpenAPI document's enum of the problem's type: a type missing
// there makes its answers break their schema (guest-no-space did).
func TestProblemTypesComplete(t *testing.T) {
	listed := apitype.ProblemTypes()
	for typ := range problemTitles {
		if !slices.Contains(listed, typ) {
			t.Errorf("problem type %q has a title but is not in apitype.ProblemTypes()", typ)
		}
		if _, ok := problemStatus[typ]; !ok {
			t.Errorf("problem type %q has a title but no status", typ)
		}
	}
	for _, typ := range listed {
		if _, ok := problemTitles[typ]; !ok {
			t.Errorf("apitype.ProblemTypes() lists %q, which has no title", typ)
		}
	}
	if len(problemStatus) != len(problemTitles) {
		t.Errorf("%d statuses for %d titles", len(problemStatus), len(problemTitles))
	}
}
