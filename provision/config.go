package provision

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/pve-inspect/pve-inspect/internal/stricttoml"
)

// DefaultConfigPath is where the node looks for its recipe configuration.
const DefaultConfigPath = "/etc/pve-bootstrap/config.toml"

// Proxmox VE 9 (Debian 13 "trixie") repository defaults. The keyring digest
// is the one Proxmox publishes for proxmox-archive-keyring-trixie.gpg (key
// fingerprint 24B30F06ECC1836A4E5EFECBA7BCD1420BFE778E); override both in
// config if Proxmox rotates the key.
const (
	DefaultRepoURI       = "http://download.proxmox.com/debian/pve"
	DefaultRepoSuite     = "trixie"
	DefaultRepoComponent = "pve-no-subscription"
	DefaultKeyringURL    = "https://enterprise.proxmox.com/debian/proxmox-archive-keyring-trixie.gpg"
	DefaultKeyringSHA256 = "136673be77aba35dcce385b28737689ad64fd785a797e57897589aed08db6e45"
)

// Config is the recipe's configuration file (TOML). Unknown keys and bad
// values are errors naming the key.
type Config struct {
	// Hostname is the node's short host name, which is also its Proxmox
	// node name ("proxmox", what the reference Inspect plugin expects).
	Hostname string `toml:"hostname"`
	// Domain is the DNS domain of the node's FQDN.
	Domain string `toml:"domain"`
	// Network says how guests reach the outside.
	Network NetworkConfig `toml:"network"`
	// Proxmox is the package repository.
	Proxmox ProxmoxConfig `toml:"proxmox"`
	// Inspectd is the pve-inspectd .deb to install.
	Inspectd DebConfig `toml:"inspectd"`
	// Secrets controls the per-instance secrets.
	Secrets SecretsConfig `toml:"secrets"`
	// Sysctl settings written to /etc/sysctl.d/90-pve-inspect.conf.
	Sysctl map[string]string `toml:"sysctl"`
	// StorageContent are the content types of the "local" storage.
	StorageContent []string `toml:"storage_content"`
	// Report is where progress goes besides the journal: "" (nowhere) or
	// "ec2-tags" (tags on the node's own EC2 instance, read by ec2 launch).
	Report string `toml:"report"`
	// Skip lists step ids not to run (for example the Proxmox steps in a
	// container test).
	Skip []string `toml:"skip"`
}

// NetworkConfig selects the bridge layout.
type NetworkConfig struct {
	// Mode is "nat" (vmbr0 without ports, masqueraded; EC2 and nested) or
	// "bridge" (vmbr0 bridged onto the primary interface).
	Mode string `toml:"mode"`
	// Bridge is the bridge name.
	Bridge string `toml:"bridge"`
	// NATAddress is vmbr0's address in nat mode (CIDR).
	NATAddress string `toml:"nat_address"`
	// SDNResolver is the upstream server the SDN dnsmasq instances get in
	// /run/dnsmasq/resolv.conf: an IP address, or "host" (or "") for a
	// copy of the host's /etc/resolv.conf at boot. `ec2 userdata|launch`
	// fill in EC2Resolver when it is empty.
	SDNResolver string `toml:"sdn_resolver"`
}

// EC2Resolver is the Amazon-provided DNS server every VPC instance can
// reach at a link-local address.
const EC2Resolver = "169.254.169.253"

// DefaultRootPasswordFile is where a generated root password is kept for
// the operator (root only), where the reference node builds keep it.
const DefaultRootPasswordFile = "/root/root-password"

// ProxmoxConfig is the Proxmox package repository.
type ProxmoxConfig struct {
	// RepoURI, Suite and Component make the deb822 source.
	RepoURI   string `toml:"repo_uri"`
	Suite     string `toml:"suite"`
	Component string `toml:"component"`
	// KeyringURL is fetched (URL or absolute path) and installed only when
	// its sha256 equals KeyringSHA256.
	KeyringURL    string `toml:"keyring_url"`
	KeyringSHA256 string `toml:"keyring_sha256"`
}

// DebConfig names a .deb by path or URL and its sha256.
type DebConfig struct {
	// Source is an absolute path or an http(s) URL.
	Source string `toml:"source"`
	// SHA256 is the .deb's digest (hex); a mismatch installs nothing.
	SHA256 string `toml:"sha256"`
}

// SecretsConfig controls per-instance secrets.
type SecretsConfig struct {
	// RootPasswordHash is a crypt(3) hash ($y$ yescrypt or $6$ sha512-crypt)
	// to set for root; when empty a random password is generated and only
	// its hash is set.
	RootPasswordHash string `toml:"root_password_hash"`
	// Sink is a command that receives a generated root password on stdin
	// (a secret store client).
	Sink []string `toml:"sink"`
	// RootPasswordFile keeps a generated root password (mode 0600) so the
	// operator and the Inspect plugin's password login can use it; "" keeps
	// no clear copy on the node.
	RootPasswordFile string `toml:"root_password_file"`
}

// DefaultConfig returns the defaults every file is read over.
func DefaultConfig() Config {
	return Config{
		Hostname: "proxmox",
		Domain:   "localdomain",
		Network:  NetworkConfig{Mode: "nat", Bridge: "vmbr0", NATAddress: "10.10.0.1/24"},
		Proxmox: ProxmoxConfig{
			RepoURI: DefaultRepoURI, Suite: DefaultRepoSuite, Component: DefaultRepoComponent,
			KeyringURL: DefaultKeyringURL, KeyringSHA256: DefaultKeyringSHA256,
		},
		// The pve-inspectd package owns the IPv6 default
		// (/etc/sysctl.d/90-pve-inspectd.conf); guests need forwarding.
		Sysctl: map[string]string{"net.ipv4.ip_forward": "1"},
		// What the reference Inspect plugin's README asks of "local": VM
		// disks (images) and container roots too.
		StorageContent: []string{"iso", "vztmpl", "backup", "snippets", "images", "rootdir", "import"},
		Secrets:        SecretsConfig{RootPasswordFile: DefaultRootPasswordFile},
	}
}

// ConfigError is a configuration error tied to one key.
type ConfigError struct {
	Key string
	Err error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("config key %q: %v", e.Key, e.Err) }
func (e *ConfigError) Unwrap() error { return e.Err }

// LoadConfig reads and validates a configuration file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(string(b))
}

// ParseConfig decodes a document over the defaults and validates it.
func ParseConfig(doc string) (Config, error) {
	c := DefaultConfig()
	if err := stricttoml.Decode(doc, &c); err != nil {
		var uk *stricttoml.UnknownKeysError
		if errors.As(err, &uk) {
			return Config{}, &ConfigError{Key: uk.Keys[0], Err: errors.New("unknown key")}
		}
		return Config{}, fmt.Errorf("parse config: %w", err)
	}
	return c, c.Validate()
}

// Encode renders the configuration as TOML.
func (c Config) Encode() ([]byte, error) {
	var sb strings.Builder
	if err := toml.NewEncoder(&sb).Encode(c); err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	return []byte(sb.String()), nil
}

var (
	hostLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	domainRe  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
	ifnameRe  = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,15}$`)
	sysctlKey = regexp.MustCompile(`^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$`)
	sysctlVal = regexp.MustCompile(`^[A-Za-z0-9 _./:-]*$`)
	contentRe = regexp.MustCompile(`^[a-z]+$`)
	cryptRe   = regexp.MustCompile(`^\$(y|6|7|gy)\$[./A-Za-z0-9$=,]+$`)
)

// Validate checks every value and names the first bad key.
func (c Config) Validate() error {
	bad := func(key, f string, a ...any) error { return &ConfigError{Key: key, Err: fmt.Errorf(f, a...)} }
	if !hostLabel.MatchString(c.Hostname) {
		return bad("hostname", "%q is not a lowercase host name label", c.Hostname)
	}
	if !domainRe.MatchString(c.Domain) {
		return bad("domain", "%q is not a lowercase DNS domain", c.Domain)
	}
	switch c.Network.Mode {
	case "nat", "bridge":
	default:
		return bad("network.mode", "%q: want nat or bridge", c.Network.Mode)
	}
	if !ifnameRe.MatchString(c.Network.Bridge) {
		return bad("network.bridge", "%q is not an interface name", c.Network.Bridge)
	}
	if c.Network.Mode == "nat" {
		p, err := netip.ParsePrefix(c.Network.NATAddress)
		if err != nil || !p.Addr().Is4() || p.Bits() > 30 || p.Masked().Addr() == p.Addr() {
			return bad("network.nat_address", "%q: want an IPv4 host address with prefix, e.g. 10.10.0.1/24", c.Network.NATAddress)
		}
	}
	switch r := c.Network.SDNResolver; r {
	case "", "host":
	default:
		if a, err := netip.ParseAddr(r); err != nil || a.Zone() != "" {
			return bad("network.sdn_resolver", "%q: want an IP address or \"host\"", r)
		}
	}
	if _, err := parseHTTPURL(c.Proxmox.RepoURI); err != nil {
		return bad("proxmox.repo_uri", "%v", err)
	}
	if !hostLabel.MatchString(c.Proxmox.Suite) {
		return bad("proxmox.suite", "%q is not a suite name", c.Proxmox.Suite)
	}
	if !hostLabel.MatchString(c.Proxmox.Component) {
		return bad("proxmox.component", "%q is not a component name", c.Proxmox.Component)
	}
	if _, err := parseHTTPURL(c.Proxmox.KeyringURL); err != nil && !strings.HasPrefix(c.Proxmox.KeyringURL, "/") {
		return bad("proxmox.keyring_url", "%v", err)
	}
	if err := validSHA256(c.Proxmox.KeyringSHA256); err != nil {
		return bad("proxmox.keyring_sha256", "%v", err)
	}
	if c.Inspectd.Source == "" {
		return bad("inspectd.source", "required: a path or http(s) URL of the pve-inspectd .deb")
	}
	if _, err := parseHTTPURL(c.Inspectd.Source); err != nil && !strings.HasPrefix(c.Inspectd.Source, "/") {
		return bad("inspectd.source", "%q: want an absolute path or an http(s) URL", c.Inspectd.Source)
	}
	if err := validSHA256(c.Inspectd.SHA256); err != nil {
		return bad("inspectd.sha256", "%v", err)
	}
	if h := c.Secrets.RootPasswordHash; h != "" && !cryptRe.MatchString(h) {
		return bad("secrets.root_password_hash", "not a yescrypt ($y$) or sha512-crypt ($6$) hash")
	}
	if f := c.Secrets.RootPasswordFile; f != "" && (!strings.HasPrefix(f, "/") || strings.ContainsAny(f, "\x00\n")) {
		return bad("secrets.root_password_file", "%q: want an absolute path or \"\"", f)
	}
	if len(c.Secrets.Sink) > 0 && !strings.HasPrefix(c.Secrets.Sink[0], "/") {
		return bad("secrets.sink", "the command must be an absolute path")
	}
	for k, v := range c.Sysctl {
		if !sysctlKey.MatchString(k) {
			return bad("sysctl."+k, "not a sysctl key")
		}
		if !sysctlVal.MatchString(v) {
			return bad("sysctl."+k, "value %q has characters a sysctl value does not", v)
		}
	}
	if len(c.StorageContent) == 0 {
		return bad("storage_content", "at least one content type")
	}
	for _, s := range c.StorageContent {
		if !contentRe.MatchString(s) {
			return bad("storage_content", "%q is not a content type", s)
		}
	}
	switch c.Report {
	case "", "ec2-tags":
	default:
		return bad("report", "%q: want \"\" or ec2-tags", c.Report)
	}
	ids := StepIDs()
	for _, s := range c.Skip {
		if !slices.Contains(ids, s) {
			return bad("skip", "%q is not a step id (have %s)", s, strings.Join(ids, ", "))
		}
	}
	return nil
}

// FQDN is the node's fully qualified name.
func (c Config) FQDN() string { return c.Hostname + "." + c.Domain }

func parseHTTPURL(s string) (string, error) {
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		return "", fmt.Errorf("%q: want an http(s) URL", s)
	}
	if strings.ContainsAny(s, " \t\n\"'`$\\") {
		return "", fmt.Errorf("%q: URL has whitespace, quotes or shell characters", s)
	}
	return s, nil
}
