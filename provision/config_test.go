package provision

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const goodDoc = `
hostname = "pve1"
domain = "example.test"
[inspectd]
source = "https://files.example.test/pve-inspectd.deb"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
`

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(goodDoc)
	if err != nil {
		t.Fatal(err)
	}
	if c.Proxmox.KeyringSHA256 != DefaultKeyringSHA256 || c.Network.Mode != "nat" || c.FQDN() != "pve1.example.test" {
		t.Errorf("defaults not applied: %+v", c)
	}
	enc, err := c.Encode()
	must(t, err)
	back, err := ParseConfig(string(enc))
	if err != nil {
		t.Fatalf("encoded config does not parse back: %v\n%s", err, enc)
	}
	if back.Hostname != c.Hostname || back.Inspectd != c.Inspectd {
		t.Errorf("round trip: %+v", back)
	}
	for _, tc := range []struct{ name, extra, key string }{
		{"bad hostname", `hostname = "PVE_1"`, "hostname"},
		{"bad mode", "[network]\nmode = \"routed\"", "network.mode"},
		{"bad nat", "[network]\nnat_address = \"10.10.0.0/24\"", "network.nat_address"},
		{"bad keyring sum", "[proxmox]\nkeyring_sha256 = \"abc\"", "proxmox.keyring_sha256"},
		{"shell in repo", "[proxmox]\nrepo_uri = \"http://x/$(reboot)\"", "proxmox.repo_uri"},
		{"clear password", "[secrets]\nroot_password_hash = \"hunter2\"", "secrets.root_password_hash"},
		{"relative sink", "[secrets]\nsink = [\"store\"]", "secrets.sink"},
		{"relative password file", "[secrets]\nroot_password_file = \"root-password\"", "secrets.root_password_file"},
		{"resolver not an address", "[network]\nsdn_resolver = \"dns.example\"", "network.sdn_resolver"},
		{"resolver with a zone", "[network]\nsdn_resolver = \"fe80::1%eth0\"", "network.sdn_resolver"},
		{"unknown step", `skip = ["nope"]`, "skip"},
		{"unknown key", `colour = "blue"`, "colour"},
		{"bad sysctl", "[sysctl]\n\"net.ipv4.ip_forward\" = \"1; reboot\"", "sysctl.net.ipv4.ip_forward"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := goodDoc
			if strings.HasPrefix(tc.extra, "hostname") {
				doc = strings.Replace(doc, `hostname = "pve1"`, tc.extra, 1)
			} else if strings.HasPrefix(tc.extra, "[") {
				doc += tc.extra + "\n"
			} else {
				doc = tc.extra + "\n" + doc
			}
			_, err := ParseConfig(doc)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Errorf("err = %v, want key %q", err, tc.key)
			}
		})
	}
	if _, err := ParseConfig(strings.Replace(goodDoc, "[inspectd]", "[inspectd", 1)); err == nil || !strings.Contains(err.Error(), "line") {
		t.Errorf("syntax error = %v", err)
	}
}

// TestDefaultsForThePlugin: a config that names only what it must gives a
// node the reference Inspect plugin can use.
func TestDefaultsForThePlugin(t *testing.T) {
	c, err := ParseConfig("[inspectd]\nsource = \"/srv/pve-inspectd.deb\"\nsha256 = \"" + strings.Repeat("ab", 32) + "\"\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Hostname != "proxmox" || c.Secrets.RootPasswordFile != "/root/root-password" || c.Network.SDNResolver != "" {
		t.Errorf("defaults: hostname %q, root_password_file %q, sdn_resolver %q", c.Hostname, c.Secrets.RootPasswordFile, c.Network.SDNResolver)
	}
	want := []string{"backup", "images", "import", "iso", "rootdir", "snippets", "vztmpl"}
	if got := storageContent(&Env{Config: c}); got != strings.Join(want, ",") {
		t.Errorf("local content %q, want %q", got, strings.Join(want, ","))
	}
}

func TestResolverContent(t *testing.T) {
	for _, tc := range []struct{ resolver, want string }{
		{"", "C /run/dnsmasq/resolv.conf 0644 root root - /etc/resolv.conf\n"},
		{"host", "C /run/dnsmasq/resolv.conf 0644 root root - /etc/resolv.conf\n"},
		{"169.254.169.253", "f /run/dnsmasq/resolv.conf 0644 root root - nameserver 169.254.169.253\\n\n"},
	} {
		c := DefaultConfig()
		c.Network.SDNResolver = tc.resolver
		got := string(resolverContent(&Env{Config: c}))
		if !strings.HasSuffix(got, "d /run/dnsmasq 0755 root root -\n"+tc.want) {
			t.Errorf("resolver %q:\n%s", tc.resolver, got)
		}
	}
}

func TestHTTPFetcher(t *testing.T) {
	body := []byte("keyring bytes")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/k.gpg" {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	defer srv.Close()
	f := HTTPFetcher{Client: srv.Client()}
	ctx := context.Background()
	got, err := f.Fetch(ctx, srv.URL+"/k.gpg", SHA256Hex(body))
	if err != nil || string(got) != string(body) {
		t.Fatalf("good fetch: %q %v", got, err)
	}
	_, err = f.Fetch(ctx, srv.URL+"/k.gpg", SHA256Hex([]byte("other")))
	var ce *ChecksumError
	if !errors.As(err, &ce) {
		t.Errorf("bad checksum: %v", err)
	}
	if _, err := f.Fetch(ctx, srv.URL+"/missing", SHA256Hex(body)); err == nil {
		t.Error("404 accepted")
	}
	if _, err := f.Fetch(ctx, "relative/path", SHA256Hex(body)); err == nil {
		t.Error("relative path accepted")
	}
	root := Root(t.TempDir())
	must(t, root.WriteFile("/srv/k.gpg", body, 0o644))
	if got, err := (HTTPFetcher{Root: root}).Fetch(ctx, "/srv/k.gpg", SHA256Hex(body)); err != nil || string(got) != string(body) {
		t.Errorf("path fetch: %q %v", got, err)
	}
}

func TestExampleConfigParses(t *testing.T) {
	c, err := LoadConfig("config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if c.Proxmox != d.Proxmox || c.Network != d.Network {
		t.Errorf("the example's defaults drifted from DefaultConfig: %+v", c)
	}
}
