package egress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/containment"
	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// stack is the whole egress machinery on a test bed: the guard, the
// registry, the resolver and the proxy serving inside the node's
// namespace, and one guest per zone.
type stack struct {
	b      *testvm.Bed
	g      *firewall.Guard
	reg    *Registry
	den    *Denials
	res    *Resolver
	proxy  *Proxy
	links  *NetlinkLinks
	guests map[string]*testvm.Guest // zone -> guest
	gw     map[string]string        // zone -> gateway address
	bridge map[string]string        // zone -> vnet bridge

	// pc is the resolver's UDP socket; serveUDP starts its read loop
	// (once; newStackWith has, unless stackConfig.holdUDP)
	pc       net.PacketConn
	serveUDP func()
}

// inNode returns a dialer that creates its sockets in the node's
// namespace, marked like the daemon's.
func inNode(b *testvm.Bed, mark uint32) DialFunc {
	return func(ctx context.Context, network, address string) (c net.Conn, err error) {
		err = b.Do(b.NodeNS(), func() error {
			d := net.Dialer{Control: MarkControl(mark)}
			c, err = d.DialContext(ctx, network, address)
			return err
		})
		return c, err
	}
}

// stackConfig changes the stack's parts from their defaults.
type stackConfig struct {
	proxy    ProxyConfig      // IdleTimeout, MaxConns, ConnsPerOwner
	resolver ResolverConfig   // QueriesPerOwner, TCPPerOwner, Timeout (zero: 1s)
	up       Upstream         // nil: the internet host's resolver
	reg      []RegistryOption // e.g. WithMaxLearned
	// holdUDP binds the resolver's UDP socket but leaves its read loop to
	// stack.serveUDP
	holdUDP bool
	// firewall plugs every guest behind a firewall bridge, as Proxmox
	// plugs a NIC with firewall=1 (testvm.GuestSpec.Firewall)
	firewall bool
}

func newStack(t *testing.T, ctx context.Context, def Policy) *stack {
	t.Helper()
	return newStackWith(t, ctx, def, stackConfig{})
}

func newStackWith(t *testing.T, ctx context.Context, def Policy, sc stackConfig) *stack {
	t.Helper()
	testkit.RequireRoot(t)
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	s := &stack{b: b, guests: map[string]*testvm.Guest{}, gw: map[string]string{}, bridge: map[string]string{}}
	zones := map[string][]string{}
	for i, id := range []string{"zonea", "zoneb", "zonec"} {
		vnet := "vnet" + id[len(id)-1:]
		n := byte(i + 1)
		v := testvm.VNet{Name: vnet, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, n, 0}), 24),
			Gateway: netip.AddrFrom4([4]byte{10, 10, n, 1}),
			DHCP:    []testvm.DHCPRange{{Start: netip.AddrFrom4([4]byte{10, 10, n, 100}), End: netip.AddrFrom4([4]byte{10, 10, n, 200})}}, SNAT: true}
		if err := b.AddZone(ctx, testvm.Zone{ID: id, VNets: []testvm.VNet{v}}); err != nil {
			t.Fatal(err)
		}
		gs, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101 + i, VNet: vnet, Firewall: sc.firewall})
		if err != nil {
			t.Fatal(err)
		}
		s.guests[id], s.gw[id], s.bridge[id] = gs, v.Gateway.String(), vnet
		zones[id] = []string{vnet}
	}
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	defRules, err := Compile(def)
	if err != nil {
		t.Fatal(err)
	}
	ec := firewall.EgressConfig{Default: defRules.Zone()}
	cfg := firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir(), Egress: ec}
	g, err := firewall.New(cfg, firewall.WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.SetZones(ctx, zones); err != nil {
		t.Fatal(err)
	}
	// the layer-2 table lets a zone's guest port send only DHCP until it
	// is mapped to its MAC and leased address (a NIC behind a firewall
	// bridge has two ports, as the daemon's port map names them)
	var ports []firewall.Port
	for _, gs := range s.guests {
		names := firewall.GuestPortNames(false, gs.VMID, 0)
		if !gs.Firewall {
			names = names[:1]
		}
		for _, n := range names {
			ports = append(ports, firewall.Port{Name: n, MAC: gs.MAC, IPv4: []netip.Addr{gs.IPv4()}})
		}
	}
	if err := g.SetPorts(ctx, ports); err != nil {
		t.Fatal(err)
	}
	links, err := NewNetlinkLinks(node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(links.Close)
	s.g, s.reg, s.den, s.links = g, NewRegistry(g, defRules, nil, sc.reg...), NewDenials(), links
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rc := sc.resolver
	// the zones' own names, as the daemon gives them: the bed's dnsmasq
	// holds <zone>.test as local and writes its leases beside its pid
	rc.ZoneNames = &LeaseNames{
		LeaseFile: func(z string) string { return filepath.Join(b.Dir(), "dnsmasq", z+".leases") },
		Domain:    func(z string) string { return z + ".test" }}
	rc.Upstreams, rc.Mark, rc.TTLFloor, rc.Dial = []string{testvm.InternetAddr + ":53"}, ec.ResolverMark(), 30*time.Second, inNode(b, ec.ResolverMark())
	if rc.Timeout == 0 {
		rc.Timeout = time.Second
	}
	s.res = NewResolver(rc, s.reg, links, s.den, sc.up, log)
	pcfg := sc.proxy
	pcfg.Mark, pcfg.Dial, pcfg.PeekTimeout = ec.ProxyMark(), inNode(b, ec.ProxyMark()), 3*time.Second
	s.proxy = NewProxy(pcfg, s.reg, links, s.den, log)
	proxy := s.proxy
	dnsPort, proxyPort := ec.Ports()
	var pc net.PacketConn
	var dnsLn, proxyLn net.Listener
	if err := b.Do(b.NodeNS(), func() (err error) {
		if pc, err = ListenUDP(ctx, fmt.Sprintf(":%d", dnsPort)); err != nil {
			return err
		}
		if dnsLn, err = net.Listen("tcp4", fmt.Sprintf(":%d", dnsPort)); err != nil {
			return err
		}
		proxyLn, err = net.Listen("tcp4", fmt.Sprintf(":%d", proxyPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := func(serve func() error) {
		wg.Go(func() {
			if err := serve(); err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		wg.Wait()
		_ = pc.Close() // a read loop never started
	})
	s.pc = pc
	s.serveUDP = sync.OnceFunc(func() { start(func() error { return s.res.ServeUDP(sctx, pc) }) })
	if !sc.holdUDP {
		s.serveUDP()
	}
	start(func() error { return s.res.ServeTCP(sctx, dnsLn) })
	start(func() error { return proxy.Serve(sctx, proxyLn) })
	return s
}

func (s *stack) set(t *testing.T, ctx context.Context, zone string, p Policy) {
	t.Helper()
	r, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.reg.Set(ctx, zone, "sb-"+zone, []string{s.bridge[zone]}, r); err != nil {
		t.Fatal(err)
	}
}

// resolve asks server from zone's guest for name (A); it returns the
// addresses, or the rcode as an error. A timed-out exchange is tried
// again (twice): the machine is shared, and a slow first answer is not a
// verdict.
func (s *stack) resolve(zone, name, server string, tcp bool) ([]string, error) {
	var got []string
	var err error
	for range 3 {
		got, err = s.resolveOnce(zone, name, server, tcp)
		if !isTimeout(err) {
			break
		}
	}
	return got, err
}

func (s *stack) resolveOnce(zone, name, server string, tcp bool) ([]string, error) {
	return s.resolveWithin(zone, name, server, tcp, 3*time.Second)
}

// resolveWithin is one exchange of resolve, given up after timeout.
func (s *stack) resolveWithin(zone, name, server string, tcp bool, timeout time.Duration) ([]string, error) {
	var got []string
	err := s.b.Do(s.guests[zone].NS, func() (err error) {
		c := &dns.Client{Timeout: timeout}
		if tcp {
			c.Net = "tcp"
		}
		got, err = askA(c, name, server)
		return err
	})
	return got, err
}

// askA asks server for name (A) through c; it returns the addresses, or
// the rcode as an error.
func askA(c *dns.Client, name, server string) ([]string, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	resp, _, err := c.Exchange(m, server)
	if err != nil {
		return nil, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("rcode %s", dns.RcodeToString[resp.Rcode])
	}
	var got []string
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			got = append(got, a.A.String())
		}
	}
	return got, nil
}

// get fetches url from zone's guest, connecting to addr (host:port)
// whatever the URL's host says, so the Host and SNI can be chosen. The
// connection is opened inside the guest's namespace first (the
// transport's own goroutines run elsewhere). For a row that must get
// through: a minute to connect and answer, so a slow machine is no
// failure.
func (s *stack) get(zone, url, addr string) (string, error) {
	return s.getWithin(zone, url, addr, time.Minute, time.Minute)
}

// getBlocked is get for a row that must not get through (the guard drops
// it, or the proxy refuses it): a dropped connection is a timeout, so its
// bounds are short (1.5 s to connect, 4 s in all).
func (s *stack) getBlocked(zone, url, addr string) (string, error) {
	return s.getWithin(zone, url, addr, 1500*time.Millisecond, 4*time.Second)
}

func (s *stack) getWithin(zone, url, addr string, dial, total time.Duration) (string, error) {
	var conn net.Conn
	if err := s.b.Do(s.guests[zone].NS, func() (err error) {
		conn, err = net.DialTimeout("tcp4", addr, dial)
		return err
	}); err != nil {
		return "", err
	}
	used := false
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if used {
				return nil, errors.New("one connection only")
			}
			used = true
			return conn, nil
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the bed's self-signed host; the SNI is what is tested
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	defer conn.Close()
	c := &http.Client{Transport: tr, Timeout: total}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return strings.TrimSpace(string(b)), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestEgressStackOnBed is the acceptance of issue 16 on the bed: an
// allowlist sandbox next to an open and a none one; every containment
// row of the policy; DNS to another resolver redirected; a policy change
// in force when Set returns; the lockdown over every policy.
func TestEgressStackOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "none"})
	s.set(t, ctx, "zonec", Policy{Mode: "open"})
	inet := testvm.InternetAddr
	other := "other." + testvm.InternetName // disallowed, same address as the allowed name
	kd := NewKernelDrops(s.g, s.reg, s.den, nil, 0, nil)
	poll := func() {
		t.Helper()
		if err := kd.Poll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	dropped := func(owner string) float64 {
		return testutil.ToFloat64(s.den.total.WithLabelValues(owner, ReasonAddress))
	}
	poll() // the baseline

	// disallowed address: nothing was resolved yet; the kernel's drop is
	// counted for the sandbox and names the destination
	if _, err := s.getBlocked("zonea", "http://"+inet+"/", inet+":80"); !isTimeout(err) {
		t.Errorf("allowlist, unresolved address: %v, want a timeout", err)
	}
	poll()
	if n := dropped("sb-zonea"); n < 1 {
		t.Errorf("kernel drop to a disallowed address: sb-zonea address denials %v, want at least 1", n)
	}
	if n := dropped("sb-zoneb") + dropped("sb-zonec") + dropped(DefaultOwnerOf("zonea", "")); n != 0 {
		t.Errorf("zonea's drop counted for another owner: %v", n)
	}
	named := false
	for _, d := range s.den.Recent("sb-zonea") {
		named = named || (d.Reason == ReasonAddress && d.Dest == inet)
	}
	if !named {
		t.Errorf("recent denials of sb-zonea do not name %s: %+v", inet, s.den.Recent("sb-zonea"))
	}
	droppedBefore := dropped("sb-zonea")
	// the allowed name resolves (through the zone's resolver, over UDP
	// and TCP) and connects over HTTP and HTTPS
	for _, tcp := range []bool{false, true} {
		if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", tcp); err != nil || len(got) != 1 || got[0] != inet {
			t.Fatalf("allowed name (tcp=%v): %v, %v", tcp, got, err)
		}
	}
	for _, u := range []string{"http://" + testvm.InternetName + "/", "https://" + testvm.InternetName + "/"} {
		port := "80"
		if strings.HasPrefix(u, "https") {
			port = "443"
		}
		if body, err := s.get("zonea", u, inet+":"+port); err != nil || body != "internet host" {
			t.Errorf("allowed name %s: %q, %v", u, body, err)
		}
	}
	// the allowed destination adds no address denial
	poll()
	if n := dropped("sb-zonea"); n != droppedBefore {
		t.Errorf("allowed connections changed sb-zonea's address denials: %v -> %v", droppedBefore, n)
	}
	// a disallowed name does not resolve, whichever resolver is asked
	for _, server := range []string{s.gw["zonea"] + ":53", inet + ":53"} {
		if got, err := s.resolve("zonea", other, server, false); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
			t.Errorf("disallowed name via %s: %v, %v; want NXDOMAIN", server, got, err)
		}
	}
	// DNS to another resolver is answered by the zone's: an allowed name
	// asked of the internet resolver still opens its address
	if got, err := s.resolve("zonea", testvm.InternetName, inet+":53", false); err != nil || len(got) != 1 {
		t.Errorf("allowed name via another resolver: %v, %v", got, err)
	}
	// a disallowed name on the allowed address is refused (SNI and Host)
	for _, u := range []string{"https://" + other + "/", "http://" + other + "/"} {
		port := "80"
		if strings.HasPrefix(u, "https") {
			port = "443"
		}
		if body, err := s.getBlocked("zonea", u, inet+":"+port); err == nil {
			t.Errorf("disallowed name %s on the allowed address: got %q", u, body)
		}
	}
	rec := map[string]bool{}
	for _, d := range s.den.Recent("sb-zonea") {
		rec[d.Reason] = true
	}
	for _, r := range []string{ReasonName, ReasonSNI, ReasonHost} {
		if !rec[r] {
			t.Errorf("no %s denial recorded: %+v", r, s.den.Recent("sb-zonea"))
		}
	}
	// none: nothing resolves, nothing connects; open: both work
	if _, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", false); err == nil {
		t.Error("none: a name resolved")
	}
	if _, err := s.getBlocked("zoneb", "http://"+inet+"/", inet+":80"); !isTimeout(err) {
		t.Errorf("none: %v, want a timeout", err)
	}
	poll()
	if n := dropped("sb-zoneb"); n < 1 {
		t.Errorf("none: kernel drop not counted for sb-zoneb: %v", n)
	}
	if got, err := s.resolve("zonec", testvm.InternetName, s.gw["zonec"]+":53", false); err != nil || len(got) != 1 {
		t.Errorf("open: resolve: %v, %v", got, err)
	}
	if body, err := s.get("zonec", "https://"+other+"/", inet+":443"); err != nil || body != "internet host" {
		t.Errorf("open: any name: %q, %v", body, err)
	}

	// a policy change is in force when Set returns (and forgets what the
	// old policy learned)
	s.set(t, ctx, "zonea", Policy{Mode: "none"})
	if _, err := s.getBlocked("zonea", "http://"+testvm.InternetName+"/", inet+":80"); !isTimeout(err) {
		t.Errorf("after the change to none: %v, want a timeout", err)
	}
	s.set(t, ctx, "zonec", Policy{Mode: "allowlist", Allow: []string{inet + "/32"}})
	if body, err := s.get("zonec", "https://"+other+"/", inet+":443"); err != nil || body != "internet host" {
		t.Errorf("CIDR-allowed address (not peeked): %q, %v", body, err)
	}

	// the lockdown wins: the allowed name no longer resolves upstream,
	// the CIDR-allowed address is cut
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	if err := s.g.SetLockdown(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err == nil {
		t.Errorf("lockdown: the allowed name resolved: %v", got)
	}
	if _, err := s.getBlocked("zonec", "https://"+other+"/", inet+":443"); !isTimeout(err) {
		t.Errorf("lockdown: CIDR-allowed address: %v, want a timeout", err)
	}
	if err := s.g.Verify(ctx); err != nil {
		t.Error(err)
	}
}

// TestEgressNodeDefaultOnBed: zones the daemon did not create get the
// node-wide default from configuration alone (no Set).
func TestEgressNodeDefaultOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zonec", Policy{Mode: "open"})
	inet := testvm.InternetAddr
	if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err != nil || len(got) != 1 {
		out, _ := exec.Command("ip", "netns", "exec", s.b.NodeNS(), "nft", "list", "ruleset").CombinedOutput()
		t.Fatalf("default allowlist: allowed name: %v, %v\n%s", got, err, out)
	}
	if body, err := s.get("zonea", "https://"+testvm.InternetName+"/", inet+":443"); err != nil || body != "internet host" {
		t.Errorf("default allowlist: allowed name: %q, %v", body, err)
	}
	if _, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", false); err != nil {
		t.Fatalf("default allowlist: allowed name: %v", err)
	}
	if body, err := s.getBlocked("zoneb", "https://other."+testvm.InternetName+"/", inet+":443"); err == nil {
		t.Errorf("default allowlist: disallowed SNI: %q", body)
	}
	if len(s.den.Recent(DefaultOwnerOf("zoneb", ""))) == 0 {
		t.Error("no denial recorded for the node default")
	}
	if body, err := s.get("zonec", "https://other."+testvm.InternetName+"/", inet+":443"); err != nil || body != "internet host" {
		t.Errorf("own open policy: %q, %v", body, err)
	}
}

// TestEgressContainmentOnBed runs the containment check, with the probe
// uploaded and run over the real guest agent, from an allow-list
// sandbox's guest: the node guard's rows and the egress rows (allowed name
// resolves and connects, disallowed name does not resolve, disallowed SNI
// on the allowed address is refused) all pass.
func TestEgressContainmentOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	res := s.runAllowlistCheck(t, ctx, s.allowlistSpec(t))
	if !res.Passed() || !res.ControlsOK {
		t.Errorf("containment check from the allow-list sandbox: %d rows not passed", len(res.Failed()))
	}
	n := 0
	for _, row := range res.Rows {
		if row.Group == containment.GroupEgress {
			n++
		}
	}
	if n != 9 {
		t.Errorf("%d egress rows, want 9 (zone-local name, allowed resolves, allowed connects, disallowed name, disallowed SNI and Host, tcp 8443, tcp 22 and udp 443 to the allowed address)", n)
	}
}

// allowlistSpec is the containment check's spec for zonea's guest under
// an allowlist of the internet host's name: the node's management
// address, metadata and the internet host.
func (s *stack) allowlistSpec(t *testing.T) containment.Spec {
	return containment.Spec{
		Gateway:      netip.MustParseAddr(s.gw["zonea"]),
		Subnet:       netip.MustParsePrefix("10.10.1.0/24"),
		HostAddrs:    []netip.Addr{netip.MustParseAddr(testvm.NodeMgmtAddr)},
		Metadata:     []netip.Addr{netip.MustParseAddr(testvm.MetadataAddr)},
		MetadataDNS:  []netip.Addr{},
		Public:       []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)},
		ExternalName: "x" + randLabel(t) + ".nope.test",
		LocalName:    testvm.LocalName("zonea"),
		Timeout:      2 * time.Second,
		Egress:       &containment.EgressSpec{AllowedName: testvm.InternetName, DeniedName: "other." + testvm.InternetName},
	}
}

// runAllowlistCheck runs the containment check of spec (allowlist
// egress rows) from zonea's guest, the probe uploaded and run over its
// agent, and logs the result's text.
func (s *stack) runAllowlistCheck(t *testing.T, ctx context.Context, spec containment.Spec) *containment.Result {
	t.Helper()
	plan, err := containment.NewPlan(spec, containment.WithEgress(containment.GuardPolicy(), "allowlist"))
	if err != nil {
		t.Fatal(err)
	}
	r := &containment.Runner{ProbePath: probebuild.ForTest(t), GuestDir: "/tmp"}
	res, err := r.Run(ctx, containment.AgentGuest{Agent: qga.New(qga.Options{}).Agent(s.guests["zonea"].Socket)}, plan)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	if err := res.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	return res
}

func randLabel(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// TestEgressContainmentKeepAliveOnBed is the containment check's row of
// an old keep-alive connection (issue 24), with the probe run over the
// real guest agent from an allow-list sandbox's guest: the probe opens a
// keep-alive connection to the allowed name through the proxy, the
// runner's Change re-applies the zone's unchanged policy (a new
// generation, so the proxy cuts the zone's connections) and the second
// request on the old connection fails: the row passes. With a Change
// that re-applies nothing the old connection still answers, and the row
// (and the check) must fail: the row can see the leak.
func TestEgressContainmentKeepAliveOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	pol := Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}}
	s.set(t, ctx, "zonea", pol)
	ga := s.guests["zonea"]
	agent := containment.AgentGuest{Agent: qga.New(qga.Options{}).Agent(ga.Socket)}
	for _, tc := range []struct {
		name    string
		reapply bool
		want    containment.Verdict
	}{
		{"policy re-applied", true, containment.Blocked},
		{"no cut", false, containment.Reachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changes := 0
			r := &containment.Runner{ProbePath: probebuild.ForTest(t), GuestDir: "/tmp", Change: func(ctx context.Context) error {
				changes++
				if !tc.reapply {
					return nil
				}
				rules, err := Compile(pol)
				if err != nil {
					return err
				}
				return s.reg.Set(ctx, "zonea", "sb-zonea", []string{s.bridge["zonea"]}, rules)
			}}
			spec := containment.Spec{
				Gateway:      netip.MustParseAddr(s.gw["zonea"]),
				Subnet:       netip.MustParsePrefix("10.10.1.0/24"),
				ControlPorts: []containment.Port{}, Metadata: []netip.Addr{}, MetadataDNS: []netip.Addr{},
				UDPPorts: []containment.Port{}, PeerUDPPorts: []containment.Port{},
				ExternalName: "x" + randLabel(t) + ".nope.test",
				LocalName:    testvm.LocalName("zonea"),
				Timeout:      2 * time.Second,
				Egress:       &containment.EgressSpec{AllowedName: testvm.InternetName, DeniedName: "other." + testvm.InternetName, KeepAlive: true},
			}
			plan, err := containment.NewPlan(spec, containment.WithEgress(containment.GuardPolicy(), "allowlist"))
			if err != nil {
				t.Fatal(err)
			}
			res, err := r.Run(ctx, agent, plan)
			if err != nil {
				t.Fatal(err)
			}
			var buf strings.Builder
			if err := res.WriteText(&buf); err != nil {
				t.Fatal(err)
			}
			t.Logf("\n%s", buf.String())
			if changes != 1 {
				t.Errorf("the policy changed %d times during the check, want once", changes)
			}
			var row *containment.Row
			for i := range res.Rows {
				if strings.HasPrefix(res.Rows[i].Name, "keep-alive connection") {
					row = &res.Rows[i]
				}
			}
			if row == nil {
				t.Fatal("no keep-alive row in the result")
			}
			if row.Observed != tc.want {
				t.Errorf("keep-alive row observed %s (%s), want %s", row.Observed, row.Detail, tc.want)
			}
			if passed := tc.want == containment.Blocked; res.Passed() != passed {
				t.Errorf("check passed = %v, want %v (%d rows not passed)", res.Passed(), passed, len(res.Failed()))
			}
		})
	}
}

// waitCount polls count until it is at least min (a minute) and returns
// its last value: a refusal is counted by the goroutine serving it, which
// on a loaded machine may still be reading what the test already sent or
// saw refused.
func waitCount(count func() float64, min float64) float64 {
	n := count()
	for deadline := time.Now().Add(time.Minute); n < min && time.Now().Before(deadline); n = count() {
		time.Sleep(20 * time.Millisecond)
	}
	return n
}
