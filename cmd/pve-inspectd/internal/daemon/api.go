package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/ctguest"
	"github.com/pve-inspect/pve-inspect/diskxfer"
	"github.com/pve-inspect/pve-inspect/hostnet"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// apiMaxConns caps the open connections of the TCP listener.
const apiMaxConns = 256

// Management is the one source of the management interfaces: the host
// guard's classification (interfaces carrying a default route) and its
// change subscription. *firewall.Guard implements it.
type Management interface {
	Management() []string
	Subscribe() (<-chan struct{}, func())
}

// APIDeps are what the sandbox API needs from the rest of the daemon.
type APIDeps struct {
	// Guests dials guest agents (qga.New(...).SandboxGuests()).
	Guests sandbox.GuestDialer
	// WinGuests dials the agents of Windows VMs
	// (qga.New(...).WindowsGuests()); nil refuses their exec and files.
	WinGuests sandbox.GuestDialer
	// Checker runs the containment check; nil answers "unavailable".
	Checker sandbox.Checker
	// ZonesChanged receives the sandbox zones and their bridges: pass the
	// host guard's SetZones.
	ZonesChanged func(ctx context.Context, zones map[string][]string) error
	// Egress enforces sandboxes' egress policies (nil: refused).
	Egress sandbox.Egress
	// Health adjusts the health monitor (the node in a box passes its
	// cgroup parent and sysfs); the interval and agent threshold come
	// from [api] when unset.
	Health sandbox.HealthOptions
	// BridgeUp says whether a vnet's bridge is on the node (nil: the
	// node's /sys/class/net, sandbox.SysfsBridgeUp, unless [api]
	// verify_bridges is off).
	BridgeUp func(ctx context.Context, bridge string) (bool, error)
	// HostInterfaces names the host guard's management and trusted
	// interfaces (nil: [guard] trusted_interfaces only): never a shared
	// vnet ([api] shared_vnets).
	HostInterfaces func() []string
	// Registerer receives the API metrics.
	Registerer prometheus.Registerer
	// BuildAgent, BuildHost, BuildURLs and BuilderProxmox replace the
	// template builds' guest agent (the sockets of [api] qga_dir), node
	// (templatebuild.NodeHost), URL guard (the resolver, the node's
	// addresses) and Proxmox client options (tests); BuildAgentPoll their
	// pause between agent probes (5s).
	BuildAgent     templatebuild.Agent
	BuildHost      templatebuild.Host
	BuildURLs      *templatebuild.URLGuard
	BuilderProxmox func(pveapi.Options) pveapi.Options
	BuildAgentPoll time.Duration
	// RetryMin and RetryMax bound the back-off between attempts to reach
	// Proxmox or bind a listener (zero: 1s and 30s).
	RetryMin, RetryMax time.Duration
}

// API is the sandbox API of `pve-inspectd run`. It is a part that never
// ends the daemon: its listeners answer 503 `unavailable` until Proxmox has
// been reached and the reconcile is done, and every failure (Proxmox down,
// a state file it cannot read, a listener it cannot bind) is logged and
// retried with back-off. The guard and the lockdown do not depend on it.
type API struct {
	cfg   config.Config
	deps  APIDeps
	log   *slog.Logger
	ready prometheus.Gauge

	local, remote gate // handlers of the unix socket and the TCP listener
	srv           atomic.Pointer[sandboxapi.Server]
	// xfer is the disk path the last build made (nil when it is off),
	// swept of leftover transfer images after each reconcile.
	xfer *diskxfer.Transfer
	// builds is the template build service the last build made (nil
	// when [templates] build is off).
	builds *templatebuild.Service
}

// NewAPI prepares the sandbox API; it does no I/O. Serve it with Run.
func NewAPI(cfg config.Config, log *slog.Logger, d APIDeps) (*API, error) {
	if d.RetryMin <= 0 {
		d.RetryMin = time.Second
	}
	if d.RetryMax < d.RetryMin {
		d.RetryMax = max(30*time.Second, d.RetryMin)
	}
	a := &API{cfg: cfg, deps: d, log: log.With("component", "sandboxapi"),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pve_inspect_sandbox_api_ready",
			Help: "1 when the sandbox API has reached Proxmox and reconciled; 0 while it answers 503 unavailable."})}
	if d.Registerer != nil {
		if err := d.Registerer.Register(a.ready); err != nil {
			return nil, fmt.Errorf("sandbox api: register metrics: %w", err)
		}
	}
	a.local.set(sandboxapi.Unavailable("sandbox api starting"))
	a.remote.set(sandboxapi.Unavailable("sandbox api starting"))
	return a, nil
}

// Server returns the API server once it is reconciled, nil before (tests).
func (a *API) Server() *sandboxapi.Server { return a.srv.Load() }

// Run binds the listeners (503 until ready), reaches Proxmox and reconciles
// with back-off, then serves the API and runs the reaper and the warm pool
// until ctx ends.
// (The management-port rules are a part of their own: mgmt.go.) It returns nil when ctx ends and
// never fails on its own.
func (a *API) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); a.serveLoop(ctx) }()
	srv := a.connect(ctx)
	if srv == nil {
		return nil
	}
	a.srv.Store(srv)
	if a.builds != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.builds.Run(ctx) }()
	}
	a.local.set(srv.LocalHandler())
	a.remote.set(a.tcpHandler(srv))
	a.ready.Set(1)
	defer a.ready.Set(0)
	a.log.Info("sandbox api ready")
	wg.Add(1)
	go func() { defer wg.Done(); srv.Engine().RunReaper(ctx) }()
	wg.Add(3)
	go func() { defer wg.Done(); srv.Engine().RunHealth(ctx) }()
	go func() { defer wg.Done(); srv.Engine().RunEgressEvents(ctx) }()
	go func() { defer wg.Done(); srv.Engine().RunPool(ctx) }()
	<-ctx.Done()
	return nil
}

// connect builds the server and reconciles until both succeed; nil when ctx
// ends first.
func (a *API) connect(ctx context.Context) *sandboxapi.Server {
	var srv *sandboxapi.Server
	b := backoff{min: a.deps.RetryMin, max: a.deps.RetryMax}
	for {
		var err error
		if srv == nil {
			srv, err = a.build()
		}
		if err == nil {
			err = a.reconcile(ctx, srv)
		}
		if err == nil {
			return srv
		}
		wait := b.next()
		a.log.Warn("sandbox api unavailable; retrying", "err", err, "retry_in", wait)
		a.local.set(sandboxapi.Unavailable("sandbox api unavailable: " + err.Error()))
		a.remote.set(sandboxapi.Unavailable("sandbox api unavailable; the daemon's log says why"))
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

// build reads the Proxmox token and makes the server; no network I/O.
func (a *API) build() (*sandboxapi.Server, error) {
	cfg, d := a.cfg, a.deps
	ac := cfg.API
	px, err := proxmoxClient(cfg, a.log)
	if err != nil {
		return nil, err
	}
	pool, err := netip.ParsePrefix(ac.AutoCIDRPool)
	if err != nil {
		return nil, fmt.Errorf("auto_cidr_pool: %w", err)
	}
	shapes, err := cfg.Pool.EngineShapes()
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	var dt sandbox.DiskTransfer
	a.xfer = nil
	if ac.DiskTransferStorage != "" {
		a.xfer = diskxfer.New(px, diskxfer.Options{Storage: ac.DiskTransferStorage, Logger: a.log})
		dt = a.xfer
	}
	health := d.Health
	if health.Interval == 0 {
		health.Interval = ac.HealthInterval
	}
	if health.AgentBrokenAfter == 0 {
		health.AgentBrokenAfter = ac.AgentBrokenAfter
	}
	if health.Node == nil {
		// the node's trees; a container's cgroup where lxc-attach's exec
		// cgroups are made too ([api] container_cgroups)
		health.Node = sandbox.NodeReader{ContainerCgroups: ac.ContainerCgroups}
	}
	bridgeUp := d.BridgeUp
	var gatewayUp func(context.Context, string, netip.Addr) (bool, error)
	if bridgeUp == nil && ac.VerifyBridges {
		bridgeUp = sandbox.SysfsBridgeUp("/sys/class/net")
		gatewayUp = hostnet.New().HasAddress
	}
	// The container API always: containers the state file records are
	// deleted whether or not [api] containers is on now.
	var ctGuests func(int) sandbox.Guest
	var ctSweep func(int) error
	if ac.Containers {
		entered := ctguest.New(ctguest.Options{LXCPath: ac.LXCPath,
			CgroupDir: func(vmid int) string { return filepath.Join(ac.ContainerCgroups, strconv.Itoa(vmid)) }})
		ctGuests = func(vmid int) sandbox.Guest { return entered.Guest(vmid) }
		ctSweep = entered.Sweep
	}
	eng, err := sandbox.New(sandbox.Options{
		Node:       cfg.Node.ID,
		Proxmox:    px,
		Guests:     d.Guests,
		WinGuests:  d.WinGuests,
		Containers: px,
		CTGuests:   ctGuests,
		CTSweep:    ctSweep,
		Checker:    d.Checker,
		QGADir:     ac.QGADir,
		Pool:       ac.Pool,
		Templates:  ac.Templates,
		StateDir:   ac.StateDir,
		Caps: sandbox.Caps{SandboxVCPUs: ac.Caps.SandboxVCPUs, SandboxMemoryMiB: ac.Caps.SandboxMemoryMiB, SandboxVMs: ac.Caps.SandboxVMs,
			NodeVCPUs: ac.Caps.NodeVCPUs, NodeMemoryMiB: ac.Caps.NodeMemoryMiB, NodeVMs: ac.Caps.NodeVMs, NodeSandboxes: ac.Caps.NodeSandboxes,
			OwnerVCPUs: ac.Caps.OwnerVCPUs, OwnerMemoryMiB: ac.Caps.OwnerMemoryMiB, OwnerVMs: ac.Caps.OwnerVMs, OwnerSandboxes: ac.Caps.OwnerSandboxes}.WithOwnerDefaults(),
		ReaperInterval:           ac.ReaperInterval,
		DiskTransfer:             dt,
		DiskThreshold:            ac.DiskTransferThreshold,
		AutoCIDRPool:             pool,
		AutoCIDRBits:             ac.AutoCIDRBits,
		AgentTimeout:             ac.AgentTimeout,
		ApplyTimeout:             ac.SDNApplyTimeout,
		HostNetworks:             hostnet.New().Prefixes,
		ZonesChanged:             d.ZonesChanged,
		BridgeUp:                 bridgeUp,
		GatewayUp:                gatewayUp,
		Egress:                   d.Egress,
		VMConfigs:                px,
		AllowUnhardenedTemplates: !ac.RequireHardenedTemplates,
		AllowUEFI:                ac.AllowUEFI,
		AllowWindows:             ac.AllowWindows,
		AllowE1000:               ac.AllowE1000,
		SharedVNets:              ac.SharedVNets,
		HostInterfaces:           a.hostInterfaces(),
		Health:                   health,
		WarmPool:                 shapes,
		PoolInterval:             cfg.Pool.Interval,
		Registerer:               d.Registerer,
		Logger:                   a.log,
	})
	if err != nil {
		return nil, err
	}
	// What the build ledger says of the node's templates, for every
	// token (GET /v1/templates/{name}), builds on or off: the daemon's
	// token's list of VMs (the templates a create may clone) and the
	// ledger `template build` keeps too.
	var ledger templatebuild.Host = templatebuild.NodeHost{StateDir: cfg.Templates.StateDir}
	if d.BuildHost != nil {
		ledger = d.BuildHost
	}
	catalog, err := templatebuild.NewCatalog(templatebuild.CatalogOptions{List: px.ListVMs, Ledger: ledger, Pinned: ac.Templates})
	if err != nil {
		return nil, err
	}
	a.builds, err = a.templateService(eng, catalog)
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	var builder sandboxapi.TemplateBuilder
	if a.builds != nil {
		builder = a.builds
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		Tokens:          auth.Open(ac.TokenFile),
		Templates:       builder,
		TemplateCatalog: catalog,
		DefaultTTL:      ac.DefaultTTL,
		MaxTTL:          ac.MaxTTL,
		MaxFileBytes:    ac.MaxFileBytes,
		Streams: sandboxapi.StreamLimits{PerToken: ac.Events.MaxStreamsPerToken, PerOwner: ac.Events.MaxStreamsPerOwner,
			Node: ac.Events.MaxStreams, WriteTimeout: ac.Events.WriteTimeout},
		MaxExecs: ac.ExecSlots, MaxFileCalls: ac.FileSlots, CollectedBytes: ac.CollectedBytes,
		OwnerExecs: ac.OwnerExecSlots, OwnerFileCalls: ac.OwnerFileSlots, OwnerCollectedBytes: ac.OwnerCollectedBytes,
		Registerer: d.Registerer,
		Logger:     a.log,
	})
	if err != nil {
		return nil, err
	}
	return srv, nil
}

// hostInterfaces names the interfaces no shared vnet may be: the guard's
// management and trusted ones (APIDeps.HostInterfaces) and [guard]
// trusted_interfaces.
func (a *API) hostInterfaces() func() []string {
	trusted := slices.Clone(a.cfg.Guard.Trusted)
	guard := a.deps.HostInterfaces
	return func() []string {
		if guard == nil {
			return trusted
		}
		return append(guard(), trusted...)
	}
}

// reconcile runs one reconcile, bounded so a hung Proxmox is retried.
func (a *API) reconcile(ctx context.Context, srv *sandboxapi.Server) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rep, err := srv.Engine().Reconcile(rctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	a.log.Info("sandbox api reconciled", "reattached", len(rep.Reattached), "torn_down", len(rep.TornDown),
		"orphan_vms", rep.OrphanVMs, "orphan_zones", rep.OrphanZones, "failed", rep.Failed)
	// a vnet the operator shares that cannot be shared keeps the API
	// unavailable, the reason in its 503 and the log, until it is fixed
	if err := srv.Engine().CheckSharedVNets(rctx); err != nil {
		return err
	}
	if a.xfer != nil {
		// Before the API serves, no transfer runs: images of the
		// transfer name are a stopped daemon's leftovers.
		sw, err := a.xfer.Sweep(rctx)
		if err != nil {
			a.log.Warn("disk transfer sweep", "err", err, "freed", sw.Freed, "left", sw.Left)
		} else if len(sw.Freed)+len(sw.Left) > 0 {
			a.log.Info("disk transfer sweep", "freed", sw.Freed, "left", sw.Left)
		}
	}
	return nil
}

// serveLoop binds the listeners and serves the gates until ctx ends; a
// listener that cannot be bound or fails is retried with back-off.
func (a *API) serveLoop(ctx context.Context) {
	b := backoff{min: a.deps.RetryMin, max: a.deps.RetryMax}
	for {
		err := a.serveOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := b.next()
		a.log.Error("sandbox api listener; retrying", "err", err, "retry_in", wait)
		if !sleep(ctx, wait) {
			return
		}
	}
}

// serveOnce binds the unix socket and (when configured) the TCP+TLS
// listener and serves both until ctx ends or one fails.
func (a *API) serveOnce(ctx context.Context) error {
	ac := a.cfg.API
	mode, _ := ac.SocketFileMode()
	uln, err := sandboxapi.ListenUnix(ac.Socket, ac.SocketGroup, os.FileMode(mode))
	if err != nil {
		return err
	}
	lns := []net.Listener{uln}
	handlers := []http.Handler{&a.local}
	if ac.Listen != "" {
		tlsCfg, err := sandboxapi.TLSConfig(ac.TLSCert, ac.TLSKey)
		if err != nil {
			uln.Close()
			return err
		}
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", ac.Listen)
		if err != nil {
			uln.Close()
			return fmt.Errorf("listen %s: %w", ac.Listen, err)
		}
		// Capped: a client on the management network cannot hold more
		// connections than this; the unix socket is for the node's own
		// users and is not capped.
		lns = append(lns, tls.NewListener(netutil.LimitListener(l, apiMaxConns), tlsCfg))
		handlers = append(handlers, &a.remote)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(lns))
	for i, ln := range lns {
		go func() { errc <- sandboxapi.Serve(sctx, ln, handlers[i]) }()
	}
	var first error
	for range lns {
		err := <-errc
		cancel() // one ended: stop the other
		if first == nil && err != nil && !errors.Is(err, net.ErrClosed) {
			first = err
		}
	}
	if first == nil && ctx.Err() == nil {
		first = errors.New("listener stopped")
	}
	return first
}

// forwardManagement sends the first management interface to out whenever
// the guard's classification changes it; it ends with ctx.
func forwardManagement(ctx context.Context, m Management, out chan string) {
	sub, unsub := m.Subscribe()
	defer unsub()
	last := firstIface(m.Management())
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub:
			cur := firstIface(m.Management())
			if cur == last || cur == "" {
				continue
			}
			last = cur
			select { // keep only the newest
			case <-out:
			default:
			}
			out <- cur
		}
	}
}

func firstIface(m []string) string {
	if len(m) > 0 {
		return m[0]
	}
	return ""
}

// gate is an http.Handler whose target can be swapped while serving.
type gate struct{ h atomic.Pointer[http.Handler] }

func (g *gate) set(h http.Handler) { g.h.Store(&h) }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) { (*g.h.Load()).ServeHTTP(w, r) }

// backoff doubles from min to max, with up to 20% jitter.
type backoff struct{ min, max, cur time.Duration }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur + time.Duration(rand.Int64N(int64(b.cur)/5+1))
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// NoTokenError is a Proxmox API token secret that cannot be read: the
// daemon has no way to talk to Proxmox.
type NoTokenError struct{ Err error }

func (e *NoTokenError) Error() string { return e.Err.Error() }
func (e *NoTokenError) Unwrap() error { return e.Err }

// ProxmoxClient makes the Proxmox API client of [api.proxmox] with the
// daemon's token; no network I/O. A secret that cannot be read is a
// *NoTokenError.
func ProxmoxClient(cfg config.Config) (*pveapi.Client, error) {
	return proxmoxClient(cfg, nil)
}

// proxmoxClient is ProxmoxClient with a logger for what the client says
// but does not fail for (another cluster node's reload warnings, other
// clients' pending SDN edits an apply commits).
func proxmoxClient(cfg config.Config, log *slog.Logger) (*pveapi.Client, error) {
	pc := cfg.API.Proxmox
	node := ProxmoxNode(cfg)
	tokenID, secret, err := ReadToken(pc.SecretFile, pc.TokenID, node)
	if err != nil {
		return nil, &NoTokenError{Err: err}
	}
	if pc.CAFile != "" {
		if _, err := os.Stat(pc.CAFile); err != nil {
			return nil, fmt.Errorf("proxmox CA: %w", err)
		}
	}
	px, err := pveapi.New(pveapi.Options{URL: pc.URL, TokenID: tokenID, Secret: secret, Node: node, RootCAFile: pc.CAFile, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("proxmox client: %w", err)
	}
	return px, nil
}

// ProxmoxNode is the Proxmox node the daemon drives: [api.proxmox] node,
// else node.id without a domain (Proxmox names a node by its host name
// without the domain: pve-common INotify.pm nodename).
func ProxmoxNode(cfg config.Config) string {
	if cfg.API.Proxmox.Node != "" {
		return cfg.API.Proxmox.Node
	}
	return access.NodeName(cfg.Node.ID)
}

// ReadToken reads the daemon's Proxmox API token from the secret file at
// path (ReadTokenSecret) and returns its full id: configured
// ([api.proxmox] token_id) when set, else the id the file names (the JSON
// pve-access-setup stores carries "full-tokenid"), else
// pve-access-setup's default for node. A configured id that is not the
// file's is an error: the secret would not match it.
func ReadToken(path, configured, node string) (tokenID, secret string, err error) {
	secret, named, err := readTokenFile(path)
	if err != nil {
		return "", "", err
	}
	if named != "" && !reTokenID.MatchString(named) {
		return "", "", fmt.Errorf("%s names %q as its token, not an API token id (user@realm!name)", path, named)
	}
	switch {
	case configured != "" && named != "" && configured != named:
		return "", "", fmt.Errorf("[api.proxmox] token_id is %q, but %s holds the secret of %q: set token_id to that (or leave it out), or run pve-access-setup for %q", configured, path, named, configured)
	case configured != "":
		return configured, secret, nil
	case named != "":
		return named, secret, nil
	case node == "":
		return "", "", fmt.Errorf("no [api.proxmox] token_id, %s names no token, and the node has no name", path)
	}
	return access.TokenID(node), secret, nil
}

// ReadTokenSecret reads a Proxmox API token secret: the plain value, or
// the JSON document `pveum user token add --output-format json` writes
// (packaging/deb/pve-access-setup stores that).
func ReadTokenSecret(path string) (string, error) {
	secret, _, err := readTokenFile(path)
	return secret, err
}

// reTokenID is an API token's full id, user@realm!name (the name as
// pve-access-control's token_subid_regex allows).
var reTokenID = regexp.MustCompile(`^[^@!\s]+@[^@!\s]+![A-Za-z][A-Za-z0-9._-]+$`)

// readTokenFile reads a token secret file: the secret, and the token's
// full id when the file is pveum's JSON and names it.
func readTokenFile(path string) (secret, tokenID string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("read proxmox token secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if strings.HasPrefix(s, "{") {
		var doc struct {
			Value   string `json:"value"`
			TokenID string `json:"full-tokenid"`
		}
		if err := json.Unmarshal([]byte(s), &doc); err != nil || doc.Value == "" {
			return "", "", fmt.Errorf("proxmox token secret %s: JSON without a \"value\"", path)
		}
		return doc.Value, doc.TokenID, nil
	}
	if s == "" {
		return "", "", fmt.Errorf("proxmox token secret %s is empty", path)
	}
	return s, "", nil
}
