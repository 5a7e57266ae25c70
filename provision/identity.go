package provision

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// IdentitySteps are the recipe steps that make an instance's identity:
// its host name and hosts entry, and its secrets (root password, the
// daemon's API token, the node certificate). An instance launched from an
// image of a built node runs only these again.
var IdentitySteps = []string{"hostname", "hosts", "secrets"}

// Identity boot unit: runs `pve-bootstrap node identity` on every boot,
// once pmxcfs is up (the token and the certificate need it) and before the
// Proxmox API and pve-inspectd start; on the instance that built the node
// it does nothing.
const (
	IdentityUnit   = "pve-bootstrap-identity.service"
	IdentityUnitAt = "/etc/systemd/system/" + IdentityUnit
	identityWants  = "/etc/systemd/system/multi-user.target.wants/" + IdentityUnit
)

// identityUnitContent is the unit file for e.IdentityArgv.
func identityUnitContent(e *Env) []byte {
	q := make([]string, len(e.IdentityArgv))
	for i, a := range e.IdentityArgv {
		q[i] = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `%`, `%%`, `$`, `$$`).Replace(a) + `"`
	}
	return []byte(`# Written by pve-bootstrap (step identity-unit).
[Unit]
Description=Give an instance launched from an image of this node its own identity
Wants=network-online.target
After=network-online.target pve-cluster.service
Before=pveproxy.service pvedaemon.service pve-inspectd.service

[Service]
Type=oneshot
ExecStart=` + strings.Join(q, " ") + `

[Install]
WantedBy=multi-user.target
`)
}

func checkIdentityUnit(ctx context.Context, e *Env) (bool, error) {
	if len(e.IdentityArgv) == 0 {
		return false, fmt.Errorf("no pve-bootstrap command for the identity unit")
	}
	ok, err := checkFile(identityUnitContent, IdentityUnitAt, 0o644)(ctx, e)
	if err != nil || !ok {
		return false, err
	}
	return e.Root.Exists(identityWants), nil
}

func applyIdentityUnit(ctx context.Context, e *Env) error {
	if len(e.IdentityArgv) == 0 {
		return fmt.Errorf("no pve-bootstrap command for the identity unit")
	}
	if err := e.Root.WriteFile(IdentityUnitAt, identityUnitContent(e), 0o644); err != nil {
		return err
	}
	for _, argv := range [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", IdentityUnit}} {
		if _, err := run(ctx, e.Runner, argv...); err != nil {
			return err
		}
	}
	return nil
}

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
