package provision

import (
	"testing"
)

// FuzzParseConfig: any document either parses into a config that validates
// and round-trips, or yields an error; it never panics.
func FuzzParseConfig(f *testing.F) {
	f.Add(goodDoc)
	f.Add(goodDoc + "[network]\nmode = \"bridge\"\n")
	f.Add("hostname = 1\n")
	f.Add("[[skip]]\n")
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := ParseConfig(doc)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config does not validate: %v", err)
		}
		enc, err := c.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseConfig(string(enc)); err != nil {
			t.Fatalf("encoded config does not parse: %v\n%s", err, enc)
		}
	})
}

// FuzzLoadState: a corrupted state.json is an error, never a panic.
func FuzzLoadState(f *testing.F) {
	f.Add([]byte(`{"version":1,"boot_id":"x","steps":{"hostname":{"status":"done"}}}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"steps":null,"reboot":{"after_step":"proxmox-kernel"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		root := Root(t.TempDir())
		if err := root.WriteFile(StatePath, b, 0o600); err != nil {
			t.Fatal(err)
		}
		st, err := LoadState(root)
		if err == nil && st.Steps == nil {
			t.Fatal("loaded state without a steps map")
		}
	})
}

// FuzzEnterpriseOff: the deb822 switch detection never panics and only
// reports "off" for a real Enabled: no line.
func FuzzEnterpriseOff(f *testing.F) {
	f.Add([]byte("Types: deb\nEnabled: no\n"))
	f.Add([]byte("Enabled:yes\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if enterpriseOff(b) && !enterpriseOff(append([]byte("X: y\n"), b...)) {
			t.Fatal("detection depends on a preceding line")
		}
	})
}
