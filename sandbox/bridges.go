package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SysfsBridgeUp is an Options.BridgeUp that looks for the bridge in the
// sysfs net class at root (/sys/class/net on a node: the kernel's own
// word on whether ifreload made it).
func SysfsBridgeUp(root string) func(ctx context.Context, bridge string) (bool, error) {
	return func(_ context.Context, bridge string) (bool, error) {
		if bridge == "" || bridge == "." || bridge == ".." || strings.ContainsRune(bridge, '/') {
			return false, fmt.Errorf("bridge name %q", bridge)
		}
		_, err := os.Stat(filepath.Join(root, bridge, "bridge"))
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, os.ErrNotExist):
			return false, nil
		}
		return false, err
	}
}
