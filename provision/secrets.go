package provision

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
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

func checkSecrets(_ context.Context, e *Env) (bool, error) {
	id, err := InstanceID(e.Root)
	if err != nil {
		return false, err
	}
	if e.State.SecretsInstance != id {
		return false, nil
	}
	if hasPveum(e) && !e.Root.Exists(e.Config.Secrets.TokenPath) {
		return false, nil
	}
	return true, nil
}

var sha512Crypt = regexp.MustCompile(`^\$6\$[./A-Za-z0-9]{1,16}\$[./A-Za-z0-9]{86}$`)

func applySecrets(ctx context.Context, e *Env) error {
	id, err := InstanceID(e.Root)
	if err != nil {
		return err
	}
	if err := setRootPassword(ctx, e); err != nil {
		return fmt.Errorf("root password: %w", err)
	}
	if hasPveum(e) {
		if err := makeToken(ctx, e); err != nil {
			return fmt.Errorf("api token: %w", err)
		}
		// A clone must not share its parent's TLS key.
		if e.Root.Exists("/usr/bin/pvecm") {
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
	if hash == "" {
		raw := make([]byte, 24)
		if _, err := io.ReadFull(e.Random, raw); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		clear := base64.RawURLEncoding.EncodeToString(raw)
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
	return nil
}

func makeToken(ctx context.Context, e *Env) error {
	s := e.Config.Secrets
	// A clone carries its parent's token: drop it, then make a fresh one.
	_, err := run(ctx, e.Runner, "pveum", "user", "token", "remove", s.TokenUser, s.TokenID)
	var ee *ExitError
	if err != nil && !errors.As(err, &ee) {
		return err
	}
	res, err := run(ctx, e.Runner, "pveum", "user", "token", "add", s.TokenUser, s.TokenID, "--privsep", "0", "--output-format", "json")
	if err != nil {
		return err
	}
	var tok struct {
		FullID string `json:"full-tokenid"`
		Value  string `json:"value"`
	}
	if err := jsonUnmarshal(res.Stdout, &tok); err != nil {
		return fmt.Errorf("pveum output: %w", err)
	}
	if tok.FullID == "" || tok.Value == "" {
		return errors.New("pveum output: no full-tokenid or value")
	}
	return e.Root.WriteFile(s.TokenPath, []byte("PVEAPIToken="+tok.FullID+"="+tok.Value+"\n"), 0o600)
}

func jsonUnmarshal(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse json: %w", err)
	}
	return nil
}
