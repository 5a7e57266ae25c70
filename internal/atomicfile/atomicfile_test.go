package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		path string
		data string
		perm os.FileMode
		ok   bool
	}{
		{"new file", filepath.Join(dir, "a"), "one", 0o600, true},
		{"replace", filepath.Join(dir, "a"), "two", 0o644, true},
		{"missing directory", filepath.Join(dir, "no", "b"), "x", 0o644, false},
		{"directory in the way", dir, "x", 0o644, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Write(c.path, []byte(c.data), c.perm)
			if (err == nil) != c.ok {
				t.Fatalf("Write: %v, want ok=%v", err, c.ok)
			}
			if !c.ok {
				if !strings.Contains(err.Error(), c.path) {
					t.Errorf("error %q does not name the path", err)
				}
				return
			}
			b, err := os.ReadFile(c.path)
			if err != nil || string(b) != c.data {
				t.Fatalf("read back %q %v", b, err)
			}
			st, _ := os.Stat(c.path)
			if st.Mode().Perm() != c.perm {
				t.Errorf("mode %v, want %v", st.Mode().Perm(), c.perm)
			}
		})
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}
