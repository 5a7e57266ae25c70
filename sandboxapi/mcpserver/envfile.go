package mcpserver

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// maxEnvFile bounds an env file: it holds a few keys, not data.
const maxEnvFile = 64 << 10

// ReadEnvFile reads KEY=VALUE lines (blank lines and # comments skipped, an
// optional "export " prefix, values optionally in matching single or double
// quotes taken literally). Errors name the line, never its value.
func ReadEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	env, err := ParseEnv(b)
	if err != nil {
		return nil, fmt.Errorf("env file %s: %w", path, err)
	}
	return env, nil
}

// ParseEnv parses the content of an env file (see ReadEnvFile).
func ParseEnv(b []byte) (map[string]string, error) {
	if len(b) > maxEnvFile {
		return nil, fmt.Errorf("larger than %d bytes", maxEnvFile)
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxEnvFile+1)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || !apitype.ValidEnvName(k) {
			return nil, fmt.Errorf("line %d: want KEY=VALUE with KEY of letters, digits and _", n)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		if strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("line %d: value holds a NUL byte", n)
		}
		if _, dup := env[k]; dup {
			return nil, fmt.Errorf("line %d: %s given twice", n, k)
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return env, nil
}
