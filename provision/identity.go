package provision

import (
	"context"
	"fmt"
	"slices"
)

// IdentitySteps are the recipe steps that make an instance's identity:
// its host name and hosts entry, and its secrets (root password, the
// daemon's API token, the node certificate). An instance launched from an
// image of a built node runs only these again.
var IdentitySteps = []string{"hostname", "hosts", "secrets"}

// Identity makes this instance's identity when its instance id is not the
// one the node's secrets were made for (an image launched again, a clone):
// it applies IdentitySteps (those not skipped) and leaves every other step
// alone. It reports the instance id and whether anything was made; on the
// instance that made the secrets it changes nothing.
func (e *Engine) Identity(ctx context.Context) (id string, changed bool, err error) {
	unlock, err := e.lock()
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if err := e.load(); err != nil {
		return "", false, err
	}
	id, err = InstanceID(e.Env.Root)
	if err != nil {
		return "", false, err
	}
	st := e.Env.State
	if st.SecretsInstance == id {
		return id, false, nil
	}
	for _, s := range e.Steps {
		if !slices.Contains(IdentitySteps, s.ID) || e.skipped(s.ID) {
			continue
		}
		if err := s.Apply(ctx, e.Env); err != nil {
			return id, true, fmt.Errorf("identity: step %s: %w", s.ID, err)
		}
		e.Env.Log.Info("identity step applied", "step", s.ID, "instance", id)
	}
	if err := st.Save(e.Env.Root); err != nil {
		return id, true, fmt.Errorf("identity: %w", err)
	}
	return id, true, nil
}
