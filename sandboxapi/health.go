package sandboxapi

import (
	"context"
	"net/http"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// beginGuest is begin for the calls that need the VM's guest (exec,
// files, the containment check): a broken VM refuses them at once with
// sandbox-broken instead of letting them wait out a timeout.
func (s *Server) beginGuest(r *http.Request, p principal) (apitype.VM, context.Context, func(error) error, error) {
	id := r.PathValue("id")
	if _, err := s.lookup(p, id); err != nil {
		return apitype.VM{}, nil, nil, err
	}
	if err := s.e.Broken(id, r.PathValue("vm")); err != nil {
		return apitype.VM{}, nil, nil, err
	}
	vm, ctx, end, err := s.begin(r, p)
	if err != nil {
		return apitype.VM{}, nil, nil, err
	}
	if err := s.e.GuestIO(vm); err != nil {
		return apitype.VM{}, nil, nil, end(err)
	}
	return vm, ctx, end, nil
}
