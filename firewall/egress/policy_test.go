package egress

import (
	"errors"
	"slices"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall"
)

func TestCompile(t *testing.T) {
	cases := []struct {
		name    string
		p       Policy
		wantErr string // field of the *PolicyError, "" for success
	}{
		{"empty is open", Policy{}, ""},
		{"allowlist of every kind", Policy{Mode: "allowlist", Allow: []string{"PyPI.org.", "*.github.com", "203.0.113.7", "198.51.100.0/24"}, Deny: []string{"198.51.100.9"}}, ""},
		{"none with deny", Policy{Mode: "none", Deny: []string{"10.0.0.0/8"}}, ""},
		{"unknown mode", Policy{Mode: "closed"}, "mode"},
		{"allow in open mode", Policy{Mode: "open", Allow: []string{"pypi.org"}}, "allow"},
		{"ipv6 address", Policy{Mode: "allowlist", Allow: []string{"2001:db8::1"}}, "allow"},
		{"ipv6 cidr", Policy{Mode: "allowlist", Allow: []string{"2001:db8::/32"}}, "allow"},
		{"host bits", Policy{Mode: "allowlist", Allow: []string{"203.0.113.7/24"}}, "allow"},
		{"bad cidr", Policy{Mode: "allowlist", Allow: []string{"203.0.113.0/33"}}, "allow"},
		{"inner wildcard", Policy{Mode: "allowlist", Allow: []string{"a.*.org"}}, "allow"},
		{"bare wildcard", Policy{Mode: "allowlist", Allow: []string{"*"}}, "allow"},
		{"tld wildcard", Policy{Mode: "allowlist", Allow: []string{"*.org"}}, "allow"},
		{"single label", Policy{Mode: "allowlist", Allow: []string{"localhost"}}, "allow"},
		{"space", Policy{Mode: "allowlist", Allow: []string{"py pi.org"}}, "allow"},
		{"empty label", Policy{Mode: "allowlist", Allow: []string{"pypi..org"}}, "allow"},
		{"deny name", Policy{Mode: "open", Deny: []string{"evil.org"}}, "deny"},
		{"name with a port", Policy{Mode: "allowlist", Allow: []string{"github.com:22", "*.example.org:8443"}}, ""},
		{"name with port 443", Policy{Mode: "allowlist", Allow: []string{"github.com:443"}}, "allow"},
		{"name with port 80", Policy{Mode: "allowlist", Allow: []string{"github.com:80"}}, "allow"},
		{"name with port 0", Policy{Mode: "allowlist", Allow: []string{"github.com:0"}}, "allow"},
		{"name with a bad port", Policy{Mode: "allowlist", Allow: []string{"github.com:ssh"}}, "allow"},
		{"name with a port too big", Policy{Mode: "allowlist", Allow: []string{"github.com:65536"}}, "allow"},
		{"address with a port", Policy{Mode: "allowlist", Allow: []string{"203.0.113.7:22"}}, "allow"},
		{"too many", Policy{Mode: "allowlist", Allow: slices.Repeat([]string{"a.org"}, MaxEntries+1)}, "allow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(tc.p)
			var pe *PolicyError
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Compile: %v", err)
			case tc.wantErr != "" && !errors.As(err, &pe):
				t.Fatalf("Compile = %v, want a *PolicyError on %s", err, tc.wantErr)
			case tc.wantErr != "" && pe.Field != tc.wantErr:
				t.Fatalf("error on field %s (%v), want %s", pe.Field, err, tc.wantErr)
			}
		})
	}
}

func TestAllowsName(t *testing.T) {
	r, err := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org", "*.github.com", "203.0.113.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"pypi.org": true, "PYPI.ORG.": true, "files.pypi.org": false,
		"github.com": false, "api.github.com": true, "a.b.github.com": true, "evilgithub.com": false,
		"github.com.evil.org": false, "pypi.org.evil.org": false, "": false, "203.0.113.5": false,
	} {
		if got := r.AllowsName(name); got != want {
			t.Errorf("AllowsName(%q) = %v, want %v", name, got, want)
		}
	}
	none, _ := Compile(Policy{Mode: "none"})
	open, _ := Compile(Policy{Mode: "open"})
	if none.AllowsName("pypi.org") || !open.AllowsName("pypi.org") {
		t.Error("mode none must allow no name, open every name")
	}
	if z := r.Zone(); z.Mode != firewall.EgressAllowlist || len(z.Allow) != 1 {
		t.Errorf("Zone() = %+v", z)
	}
	back, err := Compile(r.Policy())
	if err != nil || !slices.Equal(back.Names, r.Names) || !slices.Equal(back.Suffixes, r.Suffixes) || !slices.Equal(back.Allow4, r.Allow4) {
		t.Errorf("Policy() does not round-trip: %+v, %v", back, err)
	}
}

// TestNamePorts: a name:port entry makes the name resolve and opens only
// its port; it does not allow the name through the Host/SNI check.
func TestNamePorts(t *testing.T) {
	r, err := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org", "github.com:22", "GitHub.com:2222", "*.example.org:8443", "github.com:22"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		allows   bool
		resolves bool
		ports    []uint16
	}{
		{"pypi.org", true, true, nil},
		{"github.com", false, true, []uint16{22, 2222}},
		{"api.github.com", false, false, nil},
		{"a.example.org", false, true, []uint16{8443}},
		{"example.org", false, false, nil},
	} {
		if got := r.AllowsName(tc.name); got != tc.allows {
			t.Errorf("AllowsName(%q) = %v, want %v", tc.name, got, tc.allows)
		}
		if got := r.Resolves(tc.name); got != tc.resolves {
			t.Errorf("Resolves(%q) = %v, want %v", tc.name, got, tc.resolves)
		}
		if got := r.PortsOf(tc.name); !slices.Equal(got, tc.ports) {
			t.Errorf("PortsOf(%q) = %v, want %v", tc.name, got, tc.ports)
		}
	}
	back, err := Compile(r.Policy())
	if err != nil || !slices.Equal(back.Ports, r.Ports) {
		t.Errorf("Policy() does not round-trip the ports: %+v, %v", back.Ports, err)
	}
}
