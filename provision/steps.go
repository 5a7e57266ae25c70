package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// Host paths the recipe writes.
const (
	HostnamePath      = "/etc/hostname"
	HostsPath         = "/etc/hosts"
	KeyringPath       = "/usr/share/keyrings/proxmox-archive-keyring.gpg"
	SourcesPath       = "/etc/apt/sources.list.d/proxmox.sources"
	SysctlPath        = "/etc/sysctl.d/90-pve-inspect.conf"
	ResolverTmpfiles  = "/etc/tmpfiles.d/pve-inspect-dnsmasq.conf"
	InspectdDebCache  = "/var/cache/pve-bootstrap/pve-inspectd.deb"
	bridgeFilePattern = "/etc/network/interfaces.d/pve-inspect-%s"
)

// enterpriseSources are the deb822 files the proxmox-ve packages add for the
// subscription repositories; they are switched off with "Enabled: no".
var enterpriseSources = []string{
	"/etc/apt/sources.list.d/pve-enterprise.sources",
	"/etc/apt/sources.list.d/ceph.sources",
}

// Recipe returns the steps that turn Debian 13 into a Proxmox VE 9 node
// with pve-inspectd, in order.
func Recipe() []Step {
	return []Step{
		{ID: "hostname", Description: "set the host name", Check: checkFile(hostnameContent, HostnamePath, 0o644), Apply: applyHostname},
		{ID: "hosts", Description: "map the FQDN to the primary address in /etc/hosts", Check: checkFileErr(hostsContent, HostsPath, 0o644), Apply: writeFileErr(hostsContent, HostsPath, 0o644)},
		{ID: "sysctl", Description: "write and load " + SysctlPath, Check: checkFile(sysctlContent, SysctlPath, 0o644), Apply: applySysctl},
		{ID: "sdn-resolver", Description: "seed /run/dnsmasq/resolv.conf for the SDN resolver at boot", Check: checkFile(resolverContent, ResolverTmpfiles, 0o644), Apply: applyResolver},
		{ID: "proxmox-repo", Description: "Proxmox VE repository and sha256-verified keyring", Check: checkRepo, Apply: applyRepo},
		{ID: "full-upgrade", Description: "apt-get full-upgrade", Apply: applyFullUpgrade},
		{ID: "proxmox-kernel", Description: "install the Proxmox kernel", Reboot: true, Check: checkPackages("proxmox-default-kernel"), Apply: aptInstall("proxmox-default-kernel")},
		{ID: "proxmox-ve", Description: "install proxmox-ve, postfix, open-iscsi, chrony with preseeded debconf answers", Check: checkPackages(pveCompanions...), Apply: applyProxmoxVE},
		{ID: "enterprise-repo-off", Description: "switch off the subscription-only repositories (Enabled: no)", Check: checkEnterpriseOff, Apply: applyEnterpriseOff},
		{ID: "debian-kernel-removed", Description: "remove the Debian kernel and os-prober", Check: checkDebianKernelGone, Apply: applyRemoveDebianKernel},
		{ID: "dnsmasq", Description: "install dnsmasq with its system service disabled (SDN runs its own)", Check: checkDnsmasq, Apply: applyDnsmasq},
		{ID: "network-bridge", Description: "guest bridge (vmbr0, NAT or bridged as configured)", Check: checkBridge, Apply: applyBridge},
		{ID: "storage-content", Description: "content types of the local storage", Check: checkStorage, Apply: applyStorage, After: "proxmox-ve"},
		{ID: "pve-inspectd", Description: "install the pve-inspectd .deb (sha256-verified)", Check: checkInspectd, Apply: applyInspectd},
		{ID: "identity-unit", Description: "boot unit that gives an instance launched from an image its own identity (" + IdentityUnit + ")", Check: checkIdentityUnit, Apply: applyIdentityUnit},
		{ID: "secrets", Description: "per-instance secrets: root password (set by hash; kept 0600 in root_password_file), daemon API token", Check: checkSecrets, Apply: applySecrets},
	}
}

// StepIDs lists the recipe's step ids in order.
func StepIDs() []string {
	var ids []string
	for _, s := range Recipe() {
		ids = append(ids, s.ID)
	}
	return ids
}

var pveCompanions = []string{"proxmox-ve", "postfix", "open-iscsi", "chrony"}

// --- file-backed steps ---

type renderFn func(ctx context.Context, e *Env) (path string, data []byte, err error)

func static(f func(e *Env) []byte, path string) renderFn {
	return func(_ context.Context, e *Env) (string, []byte, error) { return path, f(e), nil }
}

func checkFile(f func(e *Env) []byte, path string, perm uint32) func(context.Context, *Env) (bool, error) {
	return checkRender(static(f, path), perm)
}

func checkFileErr(f func(context.Context, *Env) ([]byte, string, error), path string, perm uint32) func(context.Context, *Env) (bool, error) {
	return checkRender(dynamic(f, path), perm)
}

func writeFileErr(f func(context.Context, *Env) ([]byte, string, error), path string, perm uint32) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		p, data, err := dynamic(f, path)(ctx, e)
		if err != nil {
			return err
		}
		return e.Root.WriteFile(p, data, fsMode(perm))
	}
}

func dynamic(f func(context.Context, *Env) ([]byte, string, error), path string) renderFn {
	return func(ctx context.Context, e *Env) (string, []byte, error) {
		data, p, err := f(ctx, e)
		if p == "" {
			p = path
		}
		return p, data, err
	}
}

func checkRender(r renderFn, perm uint32) func(context.Context, *Env) (bool, error) {
	return func(ctx context.Context, e *Env) (bool, error) {
		p, data, err := r(ctx, e)
		if err != nil {
			return false, err
		}
		return e.Root.HasContent(p, data, fsMode(perm))
	}
}

func hostnameContent(e *Env) []byte { return []byte(e.Config.Hostname + "\n") }

func applyHostname(ctx context.Context, e *Env) error {
	if err := e.Root.WriteFile(HostnamePath, hostnameContent(e), 0o644); err != nil {
		return err
	}
	_, err := run(ctx, e.Runner, "hostname", e.Config.Hostname)
	return err
}

func hostsContent(ctx context.Context, e *Env) ([]byte, string, error) {
	pa, err := e.Addrs.PrimaryAddr(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("primary address: %w", err)
	}
	return fmt.Appendf(nil, `# Written by pve-bootstrap (step hosts): Proxmox needs the node name to
# resolve to its primary address, not to 127.0.1.1.
127.0.0.1	localhost
%s	%s %s
::1	localhost ip6-localhost ip6-loopback
ff02::1	ip6-allnodes
ff02::2	ip6-allrouters
`, pa.Prefix.Addr(), e.Config.FQDN(), e.Config.Hostname), "", nil
}

func sysctlContent(e *Env) []byte {
	var b strings.Builder
	b.WriteString("# Written by pve-bootstrap (step sysctl).\n")
	for _, k := range slices.Sorted(maps.Keys(e.Config.Sysctl)) {
		fmt.Fprintf(&b, "%s = %s\n", k, e.Config.Sysctl[k])
	}
	return []byte(b.String())
}

func applySysctl(ctx context.Context, e *Env) error {
	if err := e.Root.WriteFile(SysctlPath, sysctlContent(e), 0o644); err != nil {
		return err
	}
	_, err := run(ctx, e.Runner, "sysctl", "-p", SysctlPath)
	return err
}

func resolverContent(e *Env) []byte {
	head := `# Written by pve-bootstrap (step sdn-resolver): the SDN dnsmasq instances
# read their upstream servers from /run/dnsmasq/resolv.conf; seed it at boot.
# pve-inspectd blanks it while the egress lockdown is on (never overwritten
# here while it exists).
d /run/dnsmasq 0755 root root -
`
	switch r := e.Config.Network.SDNResolver; r {
	case "", "host":
		return []byte(head + "C /run/dnsmasq/resolv.conf 0644 root root - /etc/resolv.conf\n")
	default:
		return fmt.Appendf(nil, "%sf /run/dnsmasq/resolv.conf 0644 root root - nameserver %s\\n\n", head, r)
	}
}

func applyResolver(ctx context.Context, e *Env) error {
	if err := e.Root.WriteFile(ResolverTmpfiles, resolverContent(e), 0o644); err != nil {
		return err
	}
	_, err := run(ctx, e.Runner, "systemd-tmpfiles", "--create", ResolverTmpfiles)
	return err
}

// --- repository ---

func sourcesContent(e *Env) []byte {
	p := e.Config.Proxmox
	return fmt.Appendf(nil, "# Written by pve-bootstrap (step proxmox-repo).\nTypes: deb\nURIs: %s\nSuites: %s\nComponents: %s\nSigned-By: %s\n",
		p.RepoURI, p.Suite, p.Component, KeyringPath)
}

func checkRepo(_ context.Context, e *Env) (bool, error) {
	ok, err := e.Root.HasContent(SourcesPath, sourcesContent(e), 0o644)
	if err != nil || !ok {
		return false, err
	}
	key, err := e.Root.ReadFile(KeyringPath)
	if err != nil {
		return false, nil
	}
	return SHA256Hex(key) == e.Config.Proxmox.KeyringSHA256, nil
}

func applyRepo(ctx context.Context, e *Env) error {
	key, err := e.Fetcher.Fetch(ctx, e.Config.Proxmox.KeyringURL, e.Config.Proxmox.KeyringSHA256)
	if err != nil {
		return fmt.Errorf("proxmox keyring: %w", err)
	}
	if err := e.Root.WriteFile(KeyringPath, key, 0o644); err != nil {
		return err
	}
	if err := e.Root.WriteFile(SourcesPath, sourcesContent(e), 0o644); err != nil {
		return err
	}
	_, err = aptGet(ctx, e, "update")
	return err
}

// --- packages ---

// aptEnv makes apt and dpkg non-interactive and keep local config files.
var aptEnv = []string{"DEBIAN_FRONTEND=noninteractive", "APT_LISTCHANGES_FRONTEND=none"}

func aptGet(ctx context.Context, e *Env, args ...string) (Result, error) {
	argv := append([]string{"apt-get", "-y", "-q", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}, args...)
	return e.Runner.Run(ctx, Cmd{Argv: argv, Env: aptEnv})
}

func aptInstall(pkgs ...string) func(context.Context, *Env) error {
	return func(ctx context.Context, e *Env) error {
		_, err := aptGet(ctx, e, append([]string{"install", "--no-install-recommends"}, pkgs...)...)
		return err
	}
}

func applyFullUpgrade(ctx context.Context, e *Env) error {
	if _, err := aptGet(ctx, e, "update"); err != nil {
		return err
	}
	_, err := aptGet(ctx, e, "full-upgrade")
	return err
}

// installed returns the installed packages among names (dpkg-query
// patterns allowed), from dpkg's own database fields.
func installed(ctx context.Context, e *Env, names ...string) ([]string, error) {
	argv := append([]string{"dpkg-query", "-W", "-f=${Package}\t${db:Status-Status}\n"}, names...)
	res, err := e.Runner.Run(ctx, Cmd{Argv: argv})
	var ee *ExitError
	if errors.As(err, &ee) && ee.Code == 1 {
		err = nil // some names are unknown to dpkg: not installed
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(res.Stdout), "\n") {
		name, status, ok := strings.Cut(line, "\t")
		if ok && status == "installed" {
			out = append(out, name)
		}
	}
	return out, nil
}

func checkPackages(pkgs ...string) func(context.Context, *Env) (bool, error) {
	return func(ctx context.Context, e *Env) (bool, error) {
		have, err := installed(ctx, e, pkgs...)
		if err != nil {
			return false, err
		}
		for _, p := range pkgs {
			if !slices.Contains(have, p) {
				return false, nil
			}
		}
		return true, nil
	}
}

// debconfAnswers preseeds the questions proxmox-ve's dependencies ask.
func debconfAnswers(e *Env) []byte {
	return fmt.Appendf(nil, `postfix postfix/main_mailer_type select Local only
postfix postfix/mailname string %s
postfix postfix/destinations string %s, localhost
samba-common samba-common/dhcp boolean false
`, e.Config.FQDN(), e.Config.FQDN())
}

func applyProxmoxVE(ctx context.Context, e *Env) error {
	if _, err := e.Runner.Run(ctx, Cmd{Argv: []string{"debconf-set-selections"}, Stdin: debconfAnswers(e)}); err != nil {
		return fmt.Errorf("preseed debconf: %w", err)
	}
	_, err := aptGet(ctx, e, append([]string{"install"}, pveCompanions...)...)
	return err
}

func enterpriseOff(b []byte) bool {
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), "Enabled") && strings.EqualFold(strings.TrimSpace(v), "no") {
			return true
		}
	}
	return false
}

func checkEnterpriseOff(ctx context.Context, e *Env) (bool, error) {
	// The files arrive with proxmox-ve; before that there is work ahead.
	if ok, err := checkPackages("proxmox-ve")(ctx, e); err != nil || !ok {
		return false, err
	}
	for _, p := range enterpriseSources {
		b, err := e.Root.ReadFile(p)
		if err != nil {
			continue
		}
		if !enterpriseOff(b) {
			return false, nil
		}
	}
	return true, nil
}

func applyEnterpriseOff(ctx context.Context, e *Env) error {
	for _, p := range enterpriseSources {
		b, err := e.Root.ReadFile(p)
		if err != nil || enterpriseOff(b) {
			continue
		}
		// One stanza per file; "Enabled: no" is deb822's own switch.
		out := append([]byte("Enabled: no\n"), b...)
		if err := e.Root.WriteFile(p, out, 0o644); err != nil {
			return err
		}
	}
	_, err := aptGet(ctx, e, "update")
	return err
}

func debianKernels(ctx context.Context, e *Env) ([]string, error) {
	return installed(ctx, e, "linux-image-*", "os-prober")
}

func checkDebianKernelGone(ctx context.Context, e *Env) (bool, error) {
	have, err := debianKernels(ctx, e)
	return len(have) == 0, err
}

func applyRemoveDebianKernel(ctx context.Context, e *Env) error {
	have, err := debianKernels(ctx, e)
	if err != nil {
		return err
	}
	if len(have) > 0 {
		if _, err := aptGet(ctx, e, append([]string{"remove"}, have...)...); err != nil {
			return err
		}
	}
	_, err = run(ctx, e.Runner, "update-grub")
	return err
}

func checkDnsmasq(ctx context.Context, e *Env) (bool, error) {
	ok, err := checkPackages("dnsmasq")(ctx, e)
	if err != nil || !ok {
		return false, err
	}
	res, err := run(ctx, e.Runner, "systemctl", "is-enabled", "dnsmasq.service")
	var ee *ExitError
	if err != nil && !errors.As(err, &ee) {
		return false, err
	}
	return strings.TrimSpace(string(res.Stdout)) != "enabled", nil
}

func applyDnsmasq(ctx context.Context, e *Env) error {
	ok, err := checkPackages("dnsmasq")(ctx, e)
	if err != nil {
		return err
	}
	if !ok {
		if err := aptInstall("dnsmasq")(ctx, e); err != nil {
			return err
		}
	}
	_, err = run(ctx, e.Runner, "systemctl", "disable", "--now", "dnsmasq.service")
	return err
}

// --- network bridge ---

func bridgeContent(ctx context.Context, e *Env) ([]byte, string, error) {
	n := e.Config.Network
	path := fmt.Sprintf(bridgeFilePattern, n.Bridge)
	pa, err := e.Addrs.PrimaryAddr(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("primary address: %w", err)
	}
	if n.Mode == "bridge" {
		return fmt.Appendf(nil, `# Written by pve-bootstrap (step network-bridge): guests bridged onto %[2]s.
auto %[1]s
iface %[1]s inet dhcp
	bridge-ports %[2]s
	bridge-stp off
	bridge-fd 0
`, n.Bridge, pa.Interface), path, nil
	}
	p := netip.MustParsePrefix(n.NATAddress)
	return fmt.Appendf(nil, `# Written by pve-bootstrap (step network-bridge): guests NATed out of %[3]s.
auto %[1]s
iface %[1]s inet static
	address %[2]s
	bridge-ports none
	bridge-stp off
	bridge-fd 0
	post-up   iptables -t nat -A POSTROUTING -s %[4]s -o %[3]s -j MASQUERADE
	post-down iptables -t nat -D POSTROUTING -s %[4]s -o %[3]s -j MASQUERADE
`, n.Bridge, p, pa.Interface, p.Masked()), path, nil
}

// interfacesPath must read the interfaces.d directory for the bridge file
// to take effect.
const interfacesPath = "/etc/network/interfaces"

func sourcesInterfacesD(b []byte) bool {
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == "source" && f[1] == "/etc/network/interfaces.d/*" || f[0] == "source-directory" && strings.TrimSuffix(f[1], "/") == "/etc/network/interfaces.d") {
			return true
		}
	}
	return false
}

func checkBridge(ctx context.Context, e *Env) (bool, error) {
	ok, err := checkFileErr(bridgeContent, "", 0o644)(ctx, e)
	if err != nil || !ok {
		return false, err
	}
	b, err := e.Root.ReadFile(interfacesPath)
	if err != nil {
		return false, nil
	}
	return sourcesInterfacesD(b), nil
}

func applyBridge(ctx context.Context, e *Env) error {
	data, path, err := bridgeContent(ctx, e)
	if err != nil {
		return err
	}
	if err := e.Root.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	b, err := e.Root.ReadFile(interfacesPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if !sourcesInterfacesD(b) {
		if len(b) > 0 && !bytes.HasSuffix(b, []byte("\n")) {
			b = append(b, '\n')
		}
		b = append(b, "\n# Added by pve-bootstrap (step network-bridge).\nsource /etc/network/interfaces.d/*\n"...)
		if err := e.Root.WriteFile(interfacesPath, b, 0o644); err != nil {
			return err
		}
	}
	_, err = run(ctx, e.Runner, "ifreload", "-a")
	return err
}

// --- storage ---

func storageContent(e *Env) string {
	c := slices.Clone(e.Config.StorageContent)
	slices.Sort(c)
	return strings.Join(slices.Compact(c), ",")
}

func checkStorage(ctx context.Context, e *Env) (bool, error) {
	res, err := run(ctx, e.Runner, "pvesh", "get", "/storage/local", "--output-format", "json")
	var ee *ExitError
	if errors.As(err, &ee) {
		return false, nil // no pvesh yet, or no storage: not done
	}
	if err != nil {
		return false, err
	}
	var st struct {
		Content string `json:"content"`
	}
	if err := jsonUnmarshal(res.Stdout, &st); err != nil {
		return false, fmt.Errorf("pvesh get /storage/local: %w", err)
	}
	have := strings.Split(st.Content, ",")
	slices.Sort(have)
	return strings.Join(slices.Compact(have), ",") == storageContent(e), nil
}

func applyStorage(ctx context.Context, e *Env) error {
	_, err := run(ctx, e.Runner, "pvesm", "set", "local", "--content", storageContent(e))
	return err
}

// --- pve-inspectd ---

func checkInspectd(ctx context.Context, e *Env) (bool, error) {
	if e.State.InspectdSHA256 != e.Config.Inspectd.SHA256 {
		return false, nil
	}
	return checkPackages("pve-inspectd")(ctx, e)
}

func applyInspectd(ctx context.Context, e *Env) error {
	deb, err := e.Fetcher.Fetch(ctx, e.Config.Inspectd.Source, e.Config.Inspectd.SHA256)
	if err != nil {
		return fmt.Errorf("pve-inspectd .deb: %w", err)
	}
	if err := e.Root.WriteFile(InspectdDebCache, deb, 0o644); err != nil {
		return err
	}
	if _, err := aptGet(ctx, e, "install", "--no-install-recommends", InspectdDebCache); err != nil {
		return err
	}
	e.State.InspectdSHA256 = e.Config.Inspectd.SHA256
	return nil
}
