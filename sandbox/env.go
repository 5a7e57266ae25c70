package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Limits of CreateRequest.Env: a few keys, not data.
const (
	maxEnvVars  = 64
	maxEnvBytes = 64 << 10
)

// ValidateEnv checks variables for CreateRequest.Env: names of letters,
// digits and _ (not starting with a digit), values without NUL bytes,
// bounded in count and size. Errors name the variable, never its value.
func ValidateEnv(env map[string]string) error {
	if len(env) > maxEnvVars {
		return fmt.Errorf("%d variables: at most %d", len(env), maxEnvVars)
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !ValidEnvName(k) {
			return fmt.Errorf("%q is not a variable name (letters, digits and _, not starting with a digit)", k)
		}
		if strings.ContainsRune(env[k], 0) {
			return fmt.Errorf("the value of %s holds a NUL byte", k)
		}
		size += len(k) + len(env[k])
	}
	if size > maxEnvBytes {
		return fmt.Errorf("%d bytes of variables: at most %d", size, maxEnvBytes)
	}
	return nil
}

// ValidEnvName reports whether k is a shell variable name.
func ValidEnvName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	return strings.Trim(k, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") == ""
}

// EnvFile renders variables as a shell-sourceable file, one KEY='value' per
// line in key order.
func EnvFile(env map[string]string) []byte {
	var b bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(&b, "%s='%s'\n", k, strings.ReplaceAll(env[k], "'", `'\''`))
	}
	return b.Bytes()
}

// errEnvWrite marks a failed write of the secrets file; its message never
// carries a value.
var errEnvWrite = errors.New("write secrets file")

// writeEnv writes env into the VM at GuestEnvPath, mode 0600 (nothing when
// env is empty). The error names the VM and the cause, never a value.
func (m *manager) writeEnv(ctx context.Context, vmid int, env map[string]string) error {
	if len(env) == 0 {
		return nil
	}
	err := m.guest(vmid).WriteFile(ctx, GuestEnvPath, bytes.NewReader(EnvFile(env)), 0o600)
	if err != nil {
		p := asProblem(err)
		return fmt.Errorf("vm %d: %w %s: %s", vmid, errEnvWrite, GuestEnvPath, p.Type)
	}
	return nil
}
