package daemon

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// templateService is the daemon's template build service of [templates]
// (nil when build is off): its builds log in as builder_user with the
// password of builder_password_file, a credential used for nothing else;
// catalog answers its GET of a name no build of is remembered.
func (a *API) templateService(eng *sandbox.Engine, catalog *templatebuild.Catalog) (*templatebuild.Service, error) {
	tc := a.cfg.Templates
	if !tc.Build {
		return nil, nil
	}
	if _, err := ReadBuilderPassword(tc.BuilderPasswordFile); err != nil {
		// refused at each build too, with the same words: say it now
		a.log.Error("template builds cannot log in until the password file is fixed", "err", err)
	}
	agent := a.deps.BuildAgent
	if agent == nil {
		agent = templatebuild.AgentSockets(qga.New(qga.Options{}), a.cfg.API.QGADir)
	}
	// a task's wait (a download of a cloud image) is bounded by the
	// build's own
	po := pveapi.Options{URL: a.cfg.API.Proxmox.URL, Node: ProxmoxNode(a.cfg), RootCAFile: a.cfg.API.Proxmox.CAFile,
		TaskTimeout: tc.BuildTimeout}
	if a.deps.BuilderProxmox != nil {
		po = a.deps.BuilderProxmox(po)
	}
	login := func(ctx context.Context) (templatebuild.Proxmox, error) {
		pw, err := ReadBuilderPassword(tc.BuilderPasswordFile)
		if err != nil {
			return nil, err
		}
		return pveapi.NewWithPassword(po, tc.BuilderUser, pw)
	}
	metadata := append(a.cfg.Guard.Metadata4Prefixes(), a.cfg.Guard.Metadata6Prefixes()...)
	urls := templatebuild.URLGuard{Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}, Own: ownAddresses, Metadata: metadata}
	if a.deps.BuildURLs != nil {
		urls = *a.deps.BuildURLs
	}
	host := a.deps.BuildHost
	if host == nil {
		// the ledger `template build` keeps too: only VMs a build on
		// this node recorded are reused or destroyed
		// (and the checksum lists and archives it fetches itself, a
		// mirror's, follow no redirect the build's URL guard refuses, and
		// connect to no address it refuses: a host whose DNS answer
		// changed since its check)
		host = templatebuild.NodeHost{StateDir: tc.StateDir, Redirect: urls.Check, HTTPClient: templatebuild.GuardedClient(urls)}
	}
	// A bridge of [templates] the guard treats as management or trusted
	// is refused at each build (the freshly booted image would reach the
	// node, the LAN and the metadata services); when the interfaces cannot
	// be classified the bridge is taken as one.
	var protected []string
	if tc.Bridge != "" {
		protected = []string{tc.Bridge}
		if fc, err := FullGuardConfig(a.cfg); err == nil {
			if cls, err := firewall.Classify(context.Background(), fc); err == nil {
				protected = append(slices.Clone(cls.Management), cls.Trusted...)
			}
		}
	}
	tokenID, _, err := ReadToken(a.cfg.API.Proxmox.SecretFile, a.cfg.API.Proxmox.TokenID, ProxmoxNode(a.cfg))
	if err != nil {
		return nil, err
	}
	tokenUser, _, _ := strings.Cut(tokenID, "!")
	// The daemon's token clones the template: the role pve-access-setup
	// gives it on the templates it is told of, on this one's path alone.
	grant := func(ctx context.Context, px templatebuild.Proxmox, vmid int) error {
		g, ok := px.(interface {
			GrantACL(ctx context.Context, path, role string, users, tokens []string, propagate bool) error
		})
		if !ok {
			return fmt.Errorf("the builder's client cannot grant")
		}
		return g.GrantACL(ctx, "/vms/"+strconv.Itoa(vmid), access.RoleTemplate, []string{tokenUser}, []string{tokenID}, false)
	}
	return templatebuild.NewService(templatebuild.ServiceOptions{
		Login: login, Agent: agent, Host: host, Catalog: catalog, URLs: urls, AllowURLs: tc.AllowURLs, Mirror: tc.Mirror, Grant: grant,
		Defaults: templatebuild.Options{Storage: tc.Storage, ImageStorage: tc.ImageStorage, SnippetStorage: tc.SnippetStorage,
			WorkStorage: tc.WorkStorage, Bridge: tc.Bridge, Protected: protected, AllowUEFI: a.cfg.API.AllowUEFI, AgentWait: tc.AgentWait, CloudInitWait: tc.CloudInitWait, AgentPoll: a.deps.BuildAgentPoll,
			MaxUnpacked: int64(tc.MaxUnpackedGiB) << 30, Timeout: tc.BuildTimeout},
		MaxRunning: tc.MaxBuilds, MaxUpload: int64(tc.MaxUploadGiB) << 30, LockDir: tc.LockDir, Publish: eng.PublishNodeEvent,
		Log: a.log.With("component", "templatebuild"),
	})
}

// ownAddresses are the addresses of the node's interfaces.
func ownAddresses() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

// ReadBuilderPassword reads the template builder's password from path: a
// regular file owned by root (or the daemon's own user) that neither its
// group nor others may read or write. The password never reaches a log or
// an error.
func ReadBuilderPassword(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("[templates] builder_password_file: %w", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("[templates] builder_password_file: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("[templates] builder_password_file %s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return "", fmt.Errorf("[templates] builder_password_file %s has mode %04o: only root may read it (chmod 600 %s)", path, fi.Mode().Perm(), path)
	case !ok || (st.Uid != 0 && int(st.Uid) != os.Getuid()):
		return "", fmt.Errorf("[templates] builder_password_file %s is not root's (chown root:root %s)", path, path)
	}
	b := make([]byte, 4096)
	n, err := f.Read(b)
	if err != nil {
		return "", fmt.Errorf("[templates] builder_password_file %s: %w", path, err)
	}
	pw, _, _ := strings.Cut(string(b[:n]), "\n")
	pw = strings.TrimRight(pw, "\r")
	if pw == "" {
		return "", fmt.Errorf("[templates] builder_password_file %s is empty", path)
	}
	return pw, nil
}
