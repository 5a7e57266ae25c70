package lockdown

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// zoneDNS is a real dnsmasq in a network namespace of its own (created by
// unshare, gone with the process), forwarding through its resolver file to
// an upstream server in the same namespace.
type zoneDNS struct {
	pid      int
	ns       netns.NsHandle
	resolver string
	hosts    string
	log      string
}

// startZoneDNS starts dnsmasq on 127.0.0.1:53 in a new netns with resolver
// file resolver (pointing at 127.0.0.2) and a hosts file naming
// guest1.zone.test, plus an upstream on 127.0.0.2:53 answering
// example.test A 203.0.113.10.
func startZoneDNS(t *testing.T, dir string) *zoneDNS {
	t.Helper()
	z := &zoneDNS{
		resolver: filepath.Join(dir, "resolv.conf"),
		hosts:    filepath.Join(dir, "hosts"),
		log:      filepath.Join(dir, "dnsmasq.log"),
	}
	if err := os.WriteFile(z.resolver, []byte(origResolvUpstream), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(z.hosts, []byte("10.0.0.5 guest1.zone.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "ip link set lo up && exec dnsmasq --keep-in-foreground --conf-file=/dev/null --pid-file= --user=root " +
		"--listen-address=127.0.0.1 --bind-interfaces --port=53 --no-hosts --addn-hosts=" + z.hosts +
		" --resolv-file=" + z.resolver + " --log-facility=" + z.log + " --log-queries"
	cmd := exec.Command("unshare", "--net", "--", "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dnsmasq: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	z.pid = cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(readString(z.log), "read "+z.hosts) {
		if time.Now().After(deadline) {
			t.Fatalf("dnsmasq did not start; log: %s", readString(z.log))
		}
		time.Sleep(10 * time.Millisecond)
	}
	ns, err := netns.GetFromPid(z.pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	z.ns = ns

	pc := z.inNS(t, func() (net.PacketConn, error) { return net.ListenPacket("udp", "127.0.0.2:53") })
	srv := &dns.Server{PacketConn: pc.(net.PacketConn), Handler: dns.HandlerFunc(upstream)}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return z
}

const origResolvUpstream = "# upstream for the test zone\nnameserver 127.0.0.2\n"

// upstream answers example.test A 203.0.113.10 and NXDOMAIN otherwise.
func upstream(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	if len(r.Question) == 1 && r.Question[0].Name == "example.test." && r.Question[0].Qtype == dns.TypeA {
		rr, _ := dns.NewRR("example.test. 300 IN A 203.0.113.10")
		m.Answer = append(m.Answer, rr)
	} else {
		m.Rcode = dns.RcodeNameError
	}
	_ = w.WriteMsg(m)
}

// inNS runs open with the calling thread in the zone's netns; the socket it
// returns stays in that namespace.
func (z *zoneDNS) inNS(t *testing.T, open func() (net.PacketConn, error)) any {
	t.Helper()
	type result struct {
		c   any
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked and so discarded if restoring fails.
		orig, err := netns.Get()
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		if err := netns.Set(z.ns); err != nil {
			ch <- result{nil, err}
			return
		}
		c, err := open()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("in netns: %v", r.err)
	}
	return r.c
}

// query asks the zone's dnsmasq for name A: rcode and A answers.
func (z *zoneDNS) query(t *testing.T, name string) (int, []string) {
	t.Helper()
	c := z.inNS(t, func() (net.PacketConn, error) { return net.ListenPacket("udp", "127.0.0.1:0") }).(net.PacketConn)
	defer c.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.WriteTo(b, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}); err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	buf := make([]byte, 4096)
	n, _, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatalf("query %s: no answer from the zone resolver: %v", name, err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	var as []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			as = append(as, a.A.String())
		}
	}
	return r.Rcode, as
}

func readString(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// TestRealDnsmasqLockdown runs the controller against a real dnsmasq:
// recursion stops (REFUSED, no answer) while local names keep resolving,
// only the matching dnsmasq is signalled, a rewrite of the resolver file is
// undone, and the lift restores recursion and the file byte for byte.
func TestRealDnsmasqLockdown(t *testing.T) {
	testkit.RequireRoot(t, "dnsmasq")
	dir := t.TempDir()
	zone := startZoneDNS(t, mkdir(t, dir, "zone"))
	other := startZoneDNS(t, mkdir(t, dir, "other")) // another resolver path: never signalled

	// Positive controls before the lockdown.
	if rc, as := zone.query(t, "example.test"); rc != dns.RcodeSuccess || fmt.Sprint(as) != "[203.0.113.10]" {
		t.Fatalf("before lockdown: example.test = %s %v, want NOERROR [203.0.113.10]", dns.RcodeToString[rc], as)
	}
	if rc, as := zone.query(t, "guest1.zone.test"); rc != dns.RcodeSuccess || fmt.Sprint(as) != "[10.0.0.5]" {
		t.Fatalf("before lockdown: guest1.zone.test = %s %v", dns.RcodeToString[rc], as)
	}

	guard := &fakeGuard{mgmt: []string{"vmbr0"}}
	marker := filepath.Join(mkdir(t, dir, "etc"), "inspect-proxmox-egress-lockdown")
	c, err := New(Options{
		Marker: marker, Resolver: zone.resolver, BackupDir: mkdir(t, dir, "run"), StateFile: filepath.Join(dir, "run", "lockdown.json"),
		Reassert: time.Hour, Guard: guard, Halter: &fakeHalter{},
		Reloader: ProcSignaler{Matcher: DnsmasqMatcher{Exe: "dnsmasq", CmdlineContains: []string{zone.resolver}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMetrics(prometheus.NewRegistry())
	c.opt.Metrics = m
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e := &env{t: t, ctrl: c}
	e.waitFor("first reconcile", func(s State) bool { return !s.Updated.IsZero() })
	hostsReads := func(z *zoneDNS) int { return strings.Count(readString(z.log), "read "+z.hosts) }
	otherReads := hostsReads(other)

	if err := SetMarker(marker, true); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced", enforced)
	if hostsReads(zone) < 2 {
		t.Errorf("the zone dnsmasq shows no SIGHUP (hosts re-read) after blanking; log:\n%s", readString(zone.log))
	}
	// example.test was cached before: the SIGHUP cleared the cache, and
	// with no upstream dnsmasq refuses instead of recursing.
	checkRefused := func(when string) {
		t.Helper()
		rc, as := zone.query(t, "example.test")
		if rc != dns.RcodeRefused || len(as) != 0 {
			t.Errorf("%s: example.test = %s %v, want REFUSED and no answer", when, dns.RcodeToString[rc], as)
		}
		if rc, as := zone.query(t, "guest1.zone.test"); rc != dns.RcodeSuccess || fmt.Sprint(as) != "[10.0.0.5]" {
			t.Errorf("%s: local name guest1.zone.test = %s %v, want NOERROR [10.0.0.5]", when, dns.RcodeToString[rc], as)
		}
	}
	checkRefused("locked down")

	// Something rewrites the resolver file: blanked again, still refused.
	rewritten := time.Now().UTC()
	if err := os.WriteFile(zone.resolver, []byte("nameserver 127.0.0.2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.waitFor("re-blanked", func(s State) bool {
		return s.Updated.After(rewritten) && enforced(s) && bytes.Equal([]byte(readString(zone.resolver)), BlankContent(marker))
	})
	checkRefused("after a rewrite of the resolver file")

	if err := SetMarker(marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	if got := readString(zone.resolver); got != origResolvUpstream {
		t.Errorf("resolver after lift = %q, want %q", got, origResolvUpstream)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rc, as := zone.query(t, "example.test")
		if rc == dns.RcodeSuccess && fmt.Sprint(as) == "[203.0.113.10]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after lift: example.test = %s %v, want NOERROR [203.0.113.10]", dns.RcodeToString[rc], as)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := hostsReads(other); got != otherReads {
		t.Errorf("the other dnsmasq (not matching) was signalled: hosts read %d times, was %d", got, otherReads)
	}
	if rc, as := other.query(t, "example.test"); rc != dns.RcodeSuccess || len(as) != 1 {
		t.Errorf("the other dnsmasq was affected: example.test = %s %v", dns.RcodeToString[rc], as)
	}
}

func mkdir(t *testing.T, parent, name string) string {
	t.Helper()
	p := filepath.Join(parent, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
