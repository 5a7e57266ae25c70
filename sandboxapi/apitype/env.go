package apitype

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Limits of CreateRequest.Env: a few keys, not data.
const (
	maxEnvVars  = 64
	maxEnvBytes = 64 << 10
	// MaxEnvVars and MaxEnvBytes bound a create's env: variables, and
	// bytes of names and values in all.
	MaxEnvVars  = maxEnvVars
	MaxEnvBytes = maxEnvBytes
	// EnvNamePattern is ValidEnvName as a regular expression (the OpenAPI
	// document says it).
	EnvNamePattern = `^[A-Za-z_][A-Za-z0-9_]*$`
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
