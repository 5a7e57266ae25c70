package sandbox

import (
	"context"
	"errors"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// errDeleted is the cause given to operations cancelled by a delete.
var errDeleted = errors.New("the sandbox is being deleted")

// Begin starts an operation on a ready sandbox's VM (the first when vm
// is empty): it returns the
// sandbox, the VM, a context cancelled when the sandbox is deleted, and
// end, which must be called when the operation is over and turns an error
// caused by the delete into a conflict.
func (m *Engine) Begin(ctx context.Context, id, vm string) (apitype.Sandbox, apitype.VM, context.Context, func(error) error, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbx[id]
	if !ok {
		return apitype.Sandbox{}, apitype.VM{}, nil, nil, refuse(ErrUnknown, "sandbox %q not found", id)
	}
	if r.State != apitype.StateReady {
		return apitype.Sandbox{}, apitype.VM{}, nil, nil, r.notReady()
	}
	var v apitype.VM
	found := false
	for _, x := range r.VMs {
		if x.Name == vm || vm == "" && !found {
			v, found = x, true
		}
	}
	if !found {
		return apitype.Sandbox{}, apitype.VM{}, nil, nil, refuse(ErrUnknown, "sandbox %s has no VM %q", id, vm)
	}
	if r.opsCtx == nil {
		r.opsCtx, r.opsCancel = context.WithCancelCause(context.Background())
	}
	r.ops.Add(1)
	octx, cancel := context.WithCancelCause(ctx)
	ops := r.opsCtx
	stop := context.AfterFunc(ops, func() { cancel(context.Cause(ops)) })
	end := func(err error) error {
		stop()
		deleted := errors.Is(context.Cause(octx), errDeleted)
		cancel(nil)
		r.ops.Done()
		if err != nil && deleted {
			m.mu.Lock()
			g := r.gone
			m.mu.Unlock()
			return g.refusal(id, "was deleted during the call")
		}
		return err
	}
	return cloneSandbox(r.Sandbox), v, octx, end, nil
}

// notReady refuses a call on r, which is not ready: a conflict saying its
// state, and why it goes when it is being deleted. Call with Engine.mu
// held.
func (r *record) notReady() error {
	if r.State == apitype.StateDeleting && r.gone != nil {
		return r.gone.refusal(r.ID, "is being deleted")
	}
	return refuse(ErrConflict, "sandbox %s is %s", r.ID, r.State)
}
