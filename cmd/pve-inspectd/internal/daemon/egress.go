package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"

	"github.com/pve-inspect/pve-inspect/internal/nsrun"
)

// FullGuardConfig is GuardConfig with the [egress] section's kernel side
// (the node-wide default and the redirect ports) added.
func FullGuardConfig(cfg config.Config) (firewall.Config, error) {
	fc := GuardConfig(cfg.Guard)
	def, err := cfg.Egress.DefaultRules()
	if err != nil {
		return firewall.Config{}, fmt.Errorf("egress default: %w", err)
	}
	fc.Egress = firewall.EgressConfig{Default: def.Zone(),
		DNSPort: uint16(cfg.Egress.DNSPort), ProxyPort: uint16(cfg.Egress.ProxyPort)}
	return fc, nil
}

// InspectConfig is what `pve-inspectd status` and the doctor compare the
// kernel's table with: the guard's configuration with the [egress]
// section's kernel side and, as an option for firewall.Inspect, the
// sandboxes' persisted egress policies (what the running guard applied).
func InspectConfig(cfg config.Config) (firewall.Config, []firewall.Option, error) {
	fc, err := FullGuardConfig(cfg)
	if err != nil {
		return firewall.Config{}, nil, err
	}
	st, err := egress.LoadState(cfg.EgressStateFile())
	if err != nil {
		return firewall.Config{}, nil, fmt.Errorf("egress state: %w", err)
	}
	return fc, []firewall.Option{firewall.WithEgress(st.Zones())}, nil
}

// EgressPlan returns the sandboxes' persisted egress policies (for
// `pve-inspectd plan`).
func EgressPlan(cfg config.Config) (*egress.State, error) {
	return egress.LoadState(cfg.EgressStateFile())
}

// egressAtStart loads the persisted policies before the guard starts, so
// it adopts its table with them in force.
func (r *run) egressAtStart() (firewall.Config, []firewall.Option, error) {
	fc, err := FullGuardConfig(r.d.Config)
	if err != nil {
		return firewall.Config{}, nil, err
	}
	st, err := egress.LoadState(r.d.Config.EgressStateFile())
	if err != nil {
		return firewall.Config{}, nil, err
	}
	r.egressState = st
	return fc, []firewall.Option{firewall.WithEgress(st.Zones())}, nil
}

// upstreamsFrom returns the non-loopback IPv4 nameservers of a
// resolv.conf, as ip:53.
func upstreamsFrom(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 || fs[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fs[1])
		if err != nil || !a.Is4() || a.IsLoopback() {
			continue
		}
		out = append(out, netip.AddrPortFrom(a, 53).String())
	}
	return out, sc.Err()
}

// startEgress starts the egress policies' user-space half: the registry
// (over the guard and the persisted policies), the resolver the guard
// redirects allow-list and none zones' DNS to, the Host/SNI peek proxy,
// and the reader that turns the kernel's drops of disallowed addresses
// into per-sandbox denials. Listeners are bound before it returns.
func (r *run) startEgress(ctx context.Context) error {
	ec := r.d.Config.Egress
	def, err := ec.DefaultRules()
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	ups := ec.Upstreams
	if len(ups) == 0 {
		if ups, err = upstreamsFrom("/etc/resolv.conf"); err != nil || len(ups) == 0 {
			r.log.Warn("no upstream resolver for allowed names (set [egress] upstreams)", "component", "egress", "err", err)
		}
	}
	ns := netns.None()
	if r.d.EgressNS != nil {
		ns = *r.d.EgressNS
	}
	links, err := egress.NewNetlinkLinks(ns)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	r.parts.OnStop(links.Close)
	kcfg, err := FullGuardConfig(r.d.Config)
	if err != nil {
		return err
	}
	den := egress.NewDenials()
	if err := r.reg.Register(den.Collector()); err != nil {
		return fmt.Errorf("egress metrics: %w", err)
	}
	reg := egress.NewRegistry(r.guard, def, r.egressState, egress.WithMaxLearned(ec.MaxLearned))
	elog := egress.NewLog(egress.LogConfig{PerOwner: ec.LogEntries, Node: ec.LogEntries * ec.Owners})
	if err := r.reg.Register(elog.Collector()); err != nil {
		return fmt.Errorf("egress record metrics: %w", err)
	}
	store := egress.NewLogStore(r.d.Config.EgressLogDir(), elog, r.log)
	guests := &egress.PortGuests{Ports: r.guard.Ports}
	domain := func(zone string) string { return strings.ReplaceAll(ec.ZoneDomain, "{zone}", zone) }
	leases := &egress.LeaseNames{
		LeaseFile: func(zone string) string {
			return filepath.Join(r.d.Config.Guard.NodeRoot, "/", "var", "lib", "misc", "dnsmasq."+zone+".leases")
		},
		Domain: domain,
	}
	// what is kept of a sandbox's egress goes with its instance: deleted,
	// or a pool member claimed
	reg.OnDrop(func(zone, owner string) {
		den.Forget(owner)
		elog.Forget(owner)
		leases.Forget(zone)
	})
	// what the kernel learned before this start stays only where the
	// persisted policy is still in force
	if err := reg.Reconcile(ctx); err != nil {
		return err
	}
	res := egress.NewResolver(egress.ResolverConfig{Upstreams: ups, TTLFloor: ec.TTLFloor, TTLCeiling: ec.TTLCeiling,
		Mark: kcfg.Egress.ResolverMark(), Dial: dialIn(r.d.EgressNS, kcfg.Egress.ResolverMark()),
		QueriesPerOwner: ec.DNSQueriesPerSandbox, TCPPerOwner: ec.DNSTCPPerSandbox, Owners: ec.Owners,
		ZoneNames: leases, Domain: domain, Log: elog, Guests: guests}, reg, links, den, nil, r.log)
	proxy := egress.NewProxy(egress.ProxyConfig{Mark: kcfg.Egress.ProxyMark(), Dial: dialIn(r.d.EgressNS, kcfg.Egress.ProxyMark()),
		IdleTimeout: ec.ProxyIdleTimeout, ConnsPerOwner: ec.ProxyConnsPerSandbox, Owners: ec.Owners, Log: elog, Guests: guests}, reg, links, den, r.log)
	var pc net.PacketConn
	var dnsLn, proxyLn net.Listener
	dnsAddr, proxyAddr := fmt.Sprintf(":%d", ec.DNSPort), fmt.Sprintf(":%d", ec.ProxyPort)
	err = nsrun.Do(r.d.EgressNS, func() error {
		var lc net.ListenConfig
		var err error
		// IP_PKTINFO on from the bind: the guard redirects guest DNS
		// here already, and a query queued before the read loop runs
		// keeps its interface
		if pc, err = egress.ListenUDP(ctx, dnsAddr); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
		if dnsLn, err = lc.Listen(ctx, "tcp4", dnsAddr); err != nil {
			pc.Close()
			return fmt.Errorf("egress resolver: listen tcp %s: %w", dnsAddr, err)
		}
		if proxyLn, err = lc.Listen(ctx, "tcp4", proxyAddr); err != nil {
			pc.Close()
			dnsLn.Close()
			return fmt.Errorf("egress proxy: listen %s: %w", proxyAddr, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// the kernel's own flows of every mode (open too), from conntrack
	dnsPort, proxyPort := kcfg.Egress.Ports()
	// every owner ([egress] owners) at its share of followed flows fits
	flowShare := max(egress.DefaultMaxLiveFlows/max(ec.Owners, 1), 1)
	flows := egress.NewFlows(egress.FlowConfig{DNSPort: dnsPort, ProxyPort: proxyPort, NetNS: ns, PerOwner: flowShare}, reg, elog, guests,
		&egress.PrefixAddrs{List: links.Prefixes}, r.log)
	r.egress = &Egress{Registry: reg, Denials: den, Record: elog, Store: store, NS: ns, Prefixes: links.Prefixes, Logger: r.log,
		Open: []OpenEgress{proxyEnds{proxy, reg}, flows}}
	if r.d.egressHook != nil {
		r.d.egressHook(r.egress)
	}
	// started before the resolver and proxy, so stopped after them: the
	// last save holds every record
	r.parts.Go("egress record store", func(ctx context.Context) error { return r.saveEgressLog(ctx, store) })
	r.parts.Go("egress resolver (udp)", func(ctx context.Context) error { return res.ServeUDP(ctx, pc) })
	r.parts.Go("egress resolver (tcp)", func(ctx context.Context) error { return res.ServeTCP(ctx, dnsLn) })
	r.parts.Go("egress proxy", func(ctx context.Context) error { return proxy.Serve(ctx, proxyLn) })
	drops := egress.NewKernelDrops(r.guard, reg, den, elog, 0, r.log)
	r.parts.Go("egress kernel drops", drops.Run)
	if err := r.reg.Register(flows.Collector()); err != nil {
		return fmt.Errorf("egress flow metrics: %w", err)
	}
	r.parts.Go("egress flows", flows.Run)
	r.log.Info("egress policies in force", "component", "egress", "default", def.Mode, "upstreams", ups)
	return nil
}

// egressLogSaveEvery is how often the egress record's changed rings are
// saved: a crash loses at most this much of it, a stop nothing.
const egressLogSaveEvery = 10 * time.Second

// saveEgressLog saves the egress record's changed rings every
// egressLogSaveEvery and once more when ctx ends. A failed save is
// logged and tried again: the record is an account, and a full disk must
// not stop the guard.
func (r *run) saveEgressLog(ctx context.Context, store *egress.LogStore) error {
	t := time.NewTicker(egressLogSaveEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := store.Save(); err != nil {
				r.log.Error("save the egress record", "component", "egress", "err", err)
			}
			return nil
		case <-t.C:
			if err := store.Save(); err != nil {
				r.log.Error("save the egress record", "component", "egress", "err", err)
			}
		}
	}
}

// Egress is the daemon's egress policy state, handed to the sandbox API.
type Egress struct {
	Registry *egress.Registry
	Denials  *egress.Denials
	// Record is the sandboxes' egress record (nil: none kept); Store
	// keeps it across restarts (nil: not kept).
	Record *egress.Log
	Store  *egress.LogStore
	// NS and Prefixes are the node's namespace and its interfaces'
	// addresses: a new instance's bridges get no conntrack entry of an
	// earlier one (flushOld; nil Prefixes: not flushed). Logger says so.
	NS       netns.NsHandle
	Prefixes func() ([]egress.IfPrefix, error)
	Logger   *slog.Logger
	// Open are what records a sandbox's egress only when it ends (the
	// proxy's connections, the kernel's flows): TakeLog ends the
	// sandbox's first, so that the record handed over holds them.
	Open []OpenEgress

	// flushMu serialises flushOld: each holds a copy of the node's whole
	// conntrack table (about 1 KiB an entry, up to nf_conntrack_max),
	// and a pool refill starts its members' instances at once. Taken
	// alone, never under the registry's lock.
	flushMu sync.Mutex
}

// flushOld deletes the conntrack entries from the addresses of bridges
// (a sandbox's new instance: created, or a pool member claimed): nothing
// deletes a deleted sandbox's entries, and while one stays its remote
// peer's packets are forwarded to whichever guest holds the address now
// (the old tenant's data to the new one). A failure is returned: the new
// instance must not start with them.
func (e *Egress) flushOld(sandbox string, bridges []string) error {
	if e.Prefixes == nil || len(bridges) == 0 {
		return nil
	}
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	ps, err := e.Prefixes()
	if err != nil {
		return fmt.Errorf("remove the conntrack entries of earlier instances: %w", err)
	}
	var mine []netip.Prefix
	for _, p := range ps {
		if slices.Contains(bridges, p.Iface) {
			mine = append(mine, p.Prefix.Masked())
		}
	}
	n, err := egress.FlushFrom(e.NS, mine)
	if err != nil {
		return fmt.Errorf("remove the conntrack entries of earlier instances (%d removed): %w", n, err)
	}
	if n > 0 && e.Logger != nil {
		e.Logger.Info("conntrack entries of an earlier instance removed", "component", "egress", "sandbox", sandbox, "prefixes", mine, "removed", n)
	}
	return nil
}

// dialIn dials from sockets marked mark, created in ns (nil: the
// daemon's own namespace; the default of the egress parts then).
func dialIn(ns *netns.NsHandle, mark uint32) egress.DialFunc {
	if ns == nil {
		return nil
	}
	return func(ctx context.Context, network, address string) (c net.Conn, err error) {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
			}); err != nil {
				return err
			}
			return serr
		}}
		err = nsrun.Do(ns, func() error {
			c, err = d.DialContext(ctx, network, address)
			return err
		})
		return c, err
	}
}

func policyOf(p apitype.EgressPolicy) egress.Policy {
	return egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny}
}

// Validate implements sandbox.Egress.
func (e *Egress) Validate(p apitype.EgressPolicy) error {
	_, err := egress.Compile(policyOf(p))
	return err
}

// EntryRules are the rules Validate applies to each entry (the API's
// OpenAPI document states them).
func (e *Egress) EntryRules() sandbox.EgressEntryRules {
	return sandbox.EgressEntryRules{AllowPattern: egress.AllowEntryPattern(), DenyPattern: egress.DenyEntryPattern(),
		MaxChars: egress.MaxEntryChars, MaxEntries: egress.MaxEntries}
}

// Set implements sandbox.Egress: in the kernel and persisted when it
// returns. A policy change: no connection is removed.
func (e *Egress) Set(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error {
	r, err := egress.Compile(policyOf(p))
	if err != nil {
		return err
	}
	return e.Registry.Set(ctx, zone, sandbox, bridges, r)
}

// Start implements sandbox.EgressStarter: the policy of a new sandbox,
// before its VMs start, as a new instance (Registry.Begin: nothing of a
// stale entry of the same zone and owner carries over), then its
// bridges' prefixes cleared of an earlier instance's conntrack entries
// (flushOld). When they cannot be, the policy is removed again and the
// error returned (the create fails).
func (e *Egress) Start(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error {
	r, err := egress.Compile(policyOf(p))
	if err != nil {
		return err
	}
	if err := e.Registry.Begin(ctx, zone, sandbox, bridges, r); err != nil {
		return err
	}
	if err := e.flushOld(sandbox, bridges); err != nil {
		if rerr := e.Registry.Remove(ctx, zone); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	return nil
}

// Claim implements sandbox.EgressClaimer: Set for a new instance of the
// sandbox (a pool member claimed), its denials, counter series and
// learned addresses dropped under the registry's lock (Registry.Begin),
// then its bridges' prefixes cleared of conntrack entries (flushOld); an
// error of that fails the claim (the engine tears the member down).
func (e *Egress) Claim(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error {
	r, err := egress.Compile(policyOf(p))
	if err != nil {
		return err
	}
	if err := e.Registry.Begin(ctx, zone, sandbox, bridges, r); err != nil {
		return err
	}
	return e.flushOld(sandbox, bridges)
}

// SetNames implements sandbox.EgressNamer: the resolver answers the
// sandbox's VM names to its own guests, for its zone's current instance
// (Registry.SetNames; dropped with it).
func (e *Egress) SetNames(_ context.Context, id, zone string, names map[string][]sandbox.NameAddr) error {
	return e.Registry.SetNames(zone, id, egressNames(names))
}

// egressNames are names as the registry takes them.
func egressNames(names map[string][]sandbox.NameAddr) map[string][]egress.NameAddr {
	out := make(map[string][]egress.NameAddr, len(names))
	for n, addrs := range names {
		out[n] = make([]egress.NameAddr, 0, len(addrs))
		for _, a := range addrs {
			out[n] = append(out[n], egress.NameAddr{Bridge: a.Bridge, Addr: a.Addr})
		}
	}
	return out
}

var (
	_ sandbox.EgressClaimer = (*Egress)(nil)
	_ sandbox.EgressStarter = (*Egress)(nil)
	_ sandbox.EgressNamer   = (*Egress)(nil)
)

// Remove implements sandbox.Egress.
func (e *Egress) Remove(ctx context.Context, sandbox, zone string) error {
	e.Denials.Forget(sandbox)
	e.Record.Forget(sandbox)
	return e.Registry.Remove(ctx, zone)
}

// Status implements sandbox.Egress. A sandbox without a policy of its
// own (created before egress policies existed) is open.
func (e *Egress) Status(sandbox, zone string) apitype.EgressStatus {
	st := apitype.EgressStatus{Sandbox: sandbox, Policy: apitype.EgressPolicy{Mode: string(firewall.EgressOpen)},
		Denials: []apitype.EgressDenial{}}
	if r, ok := e.Registry.Get(zone); ok {
		p := r.Policy()
		st.Policy = apitype.EgressPolicy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny}
	}
	for _, d := range e.Denials.Recent(sandbox) {
		st.Denials = append(st.Denials, apitype.EgressDenial{Time: d.Time, Reason: d.Reason, Name: d.Name, Dest: d.Dest})
	}
	return st
}

// AllowsName reports whether a sandbox's policy allows name (an open
// sandbox allows every name).
func (e *Egress) AllowsName(sandbox, name string) bool {
	r, ok := e.Registry.Get(sandbox)
	return !ok || r.AllowsName(name)
}

// Mode returns the egress mode of a sandbox (its zone is named after it);
// open when it has no policy of its own.
func (e *Egress) Mode(sandbox string) string {
	if r, ok := e.Registry.Get(sandbox); ok {
		return string(r.Mode)
	}
	return string(firewall.EgressOpen)
}

// Log implements sandbox.EgressRecorder: a page of the sandbox's egress
// record.
func (e *Egress) Log(id string, f sandbox.EgressLogFilter) apitype.EgressLog {
	p := e.Record.Read(id, egress.LogQuery{Type: f.Type, VMID: f.VMID, Since: f.Since, Limit: f.Limit})
	out := apitype.EgressLog{Sandbox: id, Records: make([]apitype.EgressRecord, 0, len(p.Records)),
		Dropped: p.Dropped, Next: p.Next, More: p.More}
	for _, r := range p.Records {
		out.Records = append(out.Records, recordOf(r))
	}
	return out
}

var _ sandbox.EgressRecorder = (*Egress)(nil)

// TakeLog implements sandbox.EgressTaker: the sandbox's whole record,
// taken out of the node's record (egress.Log.Take) where Remove would
// drop it, once what of it is still open is ended and recorded (Open,
// within openEndWait; its guests are gone): a connection or flow is
// recorded only at its end, and one still open at the take (a flow in
// conntrack's TIME_WAIT, two minutes; one its guest kept open, days)
// would be recorded nowhere, so that a guest could keep what it sent out
// of the record handed over by not closing the connection.
func (e *Egress) TakeLog(id string) sandbox.EgressHandover {
	ctx, cancel := context.WithTimeout(context.Background(), openEndWait)
	defer cancel()
	for _, o := range e.Open {
		if err := o.EndOf(ctx, id); err != nil && e.Logger != nil {
			e.Logger.Warn("egress record handed over without what was still open", "component", "egress", "sandbox", id, "err", err)
		}
	}
	return takenLog{e.Record.Take(id)}
}

// openEndWait bounds TakeLog's wait for a sandbox's open connections and
// flows to be recorded (each in a few milliseconds; the flows' events
// lost to an overrun are found by the resync that follows, within ten
// seconds, and never recorded).
const openEndWait = 5 * time.Second

// OpenEgress is a part of the egress record that records a sandbox's
// egress when it ends: EndOf ends the sandbox's still open, recording
// it, and returns once it is recorded or ctx is done.
type OpenEgress interface {
	EndOf(ctx context.Context, sandbox string) error
}

// proxyEnds is the proxy as an OpenEgress: the connections from the
// sandbox's bridges (those of the policies it owns).
type proxyEnds struct {
	p   *egress.Proxy
	reg *egress.Registry
}

func (pe proxyEnds) EndOf(ctx context.Context, sandbox string) error {
	return pe.p.EndOf(ctx, pe.reg.BridgesOf(sandbox))
}

var _ sandbox.EgressTaker = (*Egress)(nil)

// takenLog is an egress.Taken as the engine hands it over: its records
// as the API shows them, each converted as it is written.
type takenLog struct{ t *egress.Taken }

func (l takenLog) Len() int { return l.t.Len() }

func (l takenLog) Dropped() uint64 {
	if l.t == nil {
		return 0
	}
	return l.t.Dropped
}

func (l takenLog) Next() uint64 { return l.t.Last() }

func (l takenLog) Each(fn func(apitype.EgressRecord) error) error {
	return l.t.Each(func(r egress.Record) error { return fn(recordOf(r)) })
}

func (l takenLog) Release() { l.t.Release() }

// EgressCounts implements sandbox.EgressCounter: the sandbox's egress
// record counts (the egress events).
func (e *Egress) EgressCounts(id string) (sandbox.EgressTally, bool) {
	c, ok := e.Record.Counts(id)
	if !ok {
		return sandbox.EgressTally{}, false
	}
	return sandbox.EgressTally{Gen: c.Gen, Now: countsOf(c.Now), Base: countsOf(c.Base)}, true
}

var _ sandbox.EgressCounter = (*Egress)(nil)

// RestoreEgress implements sandbox.EgressRestorer: the persisted egress
// record of the sandboxes the engine kept comes back, every other one's
// is removed.
func (e *Egress) RestoreEgress(ids []string) error {
	if e.Store == nil {
		return nil
	}
	return e.Store.Restore(ids)
}

var _ sandbox.EgressRestorer = (*Egress)(nil)

func countsOf(c egress.Counts) apitype.EgressCounts {
	return apitype.EgressCounts{DNSAnswered: c.DNSAnswered, DNSRefused: c.DNSRefused, DNSFailed: c.DNSFailed,
		ConnAllowed: c.ConnAllowed, ConnRefused: c.ConnRefused, ConnFailed: c.ConnFailed, Flows: c.Flows,
		BytesOut: c.BytesOut, BytesIn: c.BytesIn, Records: c.Records, Dropped: c.Dropped, Seq: c.Records}
}

// recordOf is r as the API shows it.
func recordOf(r egress.Record) apitype.EgressRecord {
	out := apitype.EgressRecord{Seq: r.Seq, Time: r.Time, Type: r.Type, VMID: r.Guest.VMID, MAC: r.Guest.MAC,
		Verdict: r.Verdict, Reason: r.Reason, Name: r.Name, QType: r.QType, Rcode: r.Rcode, Proto: r.Proto, Check: r.Check,
		BytesOut: r.BytesOut, BytesIn: r.BytesIn, DurationMS: r.Duration.Milliseconds(), PacketsOut: r.PacketsOut, PacketsIn: r.PacketsIn}
	if r.Guest.Addr.IsValid() {
		out.Source = r.Guest.Addr.String()
	}
	switch {
	case r.Dest.IsValid() && r.Dest.Port() == 0 && r.Proto == "":
		out.Dest = r.Dest.Addr().String() // a packet the guard dropped: the kernel keeps no port
	case r.Dest.IsValid():
		out.Dest = r.Dest.String()
	}
	for _, a := range r.Answers {
		out.Answers = append(out.Answers, a.String())
	}
	return out
}
