// Package stricttoml is the one TOML loader of pve-inspect's configuration
// files: it decodes over the defaults a value already holds, refuses every
// key the value has no field for (a typo must not silently keep a default
// on a security setting), and reports syntax errors by line.
package stricttoml

import (
	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// UnknownKeysError lists the keys of a document that the target has no
// field for, in document order.
type UnknownKeysError struct {
	Keys []string
}

func (e *UnknownKeysError) Error() string {
	return "unknown key " + strings.Join(e.Keys, ", ")
}

// Decode decodes doc into v (a pointer to a struct holding the defaults).
// A syntax error names its line; keys without a field fail with
// *UnknownKeysError, and v may then be partly decoded.
func Decode(doc string, v any) error {
	md, err := toml.Decode(doc, v)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("line %d: %s", pe.Position.Line, pe.Message)
		}
		return err
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return &UnknownKeysError{Keys: keys}
	}
	return nil
}
