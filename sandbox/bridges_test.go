package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestSysfsBridgeUp: a bridge is a net class entry with a bridge
// directory; a plain link, a missing one and a name that would leave the
// directory are not.
func TestSysfsBridgeUp(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"sbv0/bridge", "eth0"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	up := sandbox.SysfsBridgeUp(root)
	for _, c := range []struct {
		name   string
		want   bool
		wantOK bool
	}{
		{"sbv0", true, true}, {"eth0", false, true}, {"sbv9", false, true},
		{"../sbv0", false, false}, {"", false, false}, {"..", false, false},
	} {
		got, err := up(context.Background(), c.name)
		if got != c.want || (err == nil) != c.wantOK {
			t.Errorf("%q: %v %v", c.name, got, err)
		}
	}
}
