package provision

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Paths of the pve-inspectd package the secrets step drives: the package's
// own access setup makes the daemon's user, role and API token (limited to
// its pool, SDN and node) and writes the token's secret file.
const (
	AccessSetupPath = "/usr/lib/pve-inspectd/pve-access-setup"
	TokenPath       = "/etc/pve-inspectd/pve-token"
)

var pveumPaths = []string{"/usr/sbin/pveum", "/usr/bin/pveum"}

func hasPveum(e *Env) bool {
	for _, p := range pveumPaths {
		if e.Root.Exists(p) {
			return true
		}
	}
	return false
}

func tokenPresent(e *Env) bool {
	fi, err := os.Stat(e.Root.Path(TokenPath))
	return err == nil && fi.Size() > 0
}

func checkSecrets(_ context.Context, e *Env) (bool, error) {
	id, err := InstanceID(e.Root)
	if err != nil {
		return false, err
	}
	if e.State.SecretsInstance != id {
		return false, nil
	}
	if hasPveum(e) && !tokenPresent(e) {
		return false, nil
	}
	if f := e.Config.Secrets.RootPasswordFile; f != "" && e.Config.Secrets.RootPasswordHash == "" && !e.Root.Exists(f) {
		return false, nil
	}
	return true, nil
}

var sha512Crypt = regexp.MustCompile(`^\$6\$[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{86}$`)

// applySecrets makes this instance's secrets. On the first instance of a
// disk the API token the package made at install is kept; on any later
// instance (a clone) the token and the node certificate are replaced, since
// they were inherited from the parent.
func applySecrets(ctx context.Context, e *Env) error {
	id, err := InstanceID(e.Root)
	if err != nil {
		return err
	}
	inherited := e.State.SecretsInstance != "" && e.State.SecretsInstance != id
	if err := setRootPassword(ctx, e); err != nil {
		return fmt.Errorf("root password: %w", err)
	}
	if hasPveum(e) {
		if inherited || !tokenPresent(e) {
			if err := renewToken(ctx, e); err != nil {
				return fmt.Errorf("api token: %w", err)
			}
		}
		if inherited && e.Root.Exists("/usr/bin/pvecm") {
			if _, err := run(ctx, e.Runner, "pvecm", "updatecerts", "--force"); err != nil {
				return fmt.Errorf("node certificate: %w", err)
			}
		}
	} else {
		e.Log.Info("pveum not installed; no API token made", "step", "secrets")
	}
	e.State.SecretsInstance = id
	return nil
}

func setRootPassword(ctx context.Context, e *Env) error {
	hash := e.Config.Secrets.RootPasswordHash
	clear := ""
	if hash == "" {
		raw := make([]byte, 24)
		if _, err := io.ReadFull(e.Random, raw); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		clear = base64.RawURLEncoding.EncodeToString(raw)
		res, err := e.Runner.Run(ctx, Cmd{Argv: []string{"openssl", "passwd", "-6", "-stdin"}, Stdin: []byte(clear + "\n")})
		if err != nil {
			return fmt.Errorf("hash: %w", err)
		}
		hash = strings.TrimSpace(string(res.Stdout))
		if !sha512Crypt.MatchString(hash) {
			return errors.New("hash: openssl did not print a sha512-crypt hash")
		}
		if len(e.Config.Secrets.Sink) > 0 {
			if _, err := e.Runner.Run(ctx, Cmd{Argv: e.Config.Secrets.Sink, Stdin: []byte(clear + "\n")}); err != nil {
				return fmt.Errorf("hand to secret store: %w", err)
			}
		}
	}
	if _, err := e.Runner.Run(ctx, Cmd{Argv: []string{"chpasswd", "-e"}, Stdin: []byte("root:" + hash + "\n")}); err != nil {
		return fmt.Errorf("set: %w", err)
	}
	// Kept only once it is root's password; a hash from the config has no
	// clear text to keep.
	if f := e.Config.Secrets.RootPasswordFile; f != "" && clear != "" {
		if err := e.Root.WriteFile(f, []byte(clear+"\n"), 0o600); err != nil {
			return fmt.Errorf("keep in %s: %w", f, err)
		}
	}
	return nil
}

// renewToken drops the token secret and lets the package's access setup make
// a new token (it replaces the token only when the secret file is missing).
func renewToken(ctx context.Context, e *Env) error {
	if !e.Root.Exists(AccessSetupPath) {
		return fmt.Errorf("%s missing: is the pve-inspectd package installed?", AccessSetupPath)
	}
	if err := e.Root.Remove(TokenPath); err != nil {
		return err
	}
	if _, err := run(ctx, e.Runner, AccessSetupPath); err != nil {
		return err
	}
	if !tokenPresent(e) {
		return fmt.Errorf("%s ran but wrote no %s", AccessSetupPath, TokenPath)
	}
	return nil
}

func jsonUnmarshal(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse json: %w", err)
	}
	return nil
}
