package egress

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// fakeGuard records what the egress parts ask of the guard.
type fakeGuard struct {
	mu       sync.Mutex
	policies map[string]firewall.ZoneEgress
	learned  map[string]map[netip.Addr]time.Duration
	forgot   []string
	failSet  error
	zoneOf   map[string]string // bridge -> zone (ZoneOfBridge)
}

func newFakeGuard() *fakeGuard {
	return &fakeGuard{learned: map[string]map[netip.Addr]time.Duration{}}
}

func (f *fakeGuard) SetEgress(_ context.Context, p map[string]firewall.ZoneEgress) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failSet != nil {
		return f.failSet
	}
	f.policies = p
	return nil
}

func (f *fakeGuard) EgressOf(iface string) (firewall.ZoneEgress, bool) {
	return firewall.ZoneEgress{}, iface != "mgmt0" && iface != "lo"
}

func (f *fakeGuard) ZoneOfBridge(iface string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	z, ok := f.zoneOf[iface]
	return z, ok
}

func (f *fakeGuard) LearnOpen(_ context.Context, iface string, addrs []netip.Addr, _ firewall.Opening, ttl time.Duration) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var skipped []netip.Addr
	for _, a := range addrs {
		if a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLoopback() {
			skipped = append(skipped, a)
			continue
		}
		if f.learned[iface] == nil {
			f.learned[iface] = map[netip.Addr]time.Duration{}
		}
		f.learned[iface][a] = ttl
	}
	return skipped, nil
}

func (f *fakeGuard) Forget(_ context.Context, ifaces []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, ifaces...)
	for _, i := range ifaces {
		delete(f.learned, i)
	}
	return nil
}

func (f *fakeGuard) ForgetExcept(_ context.Context, keep []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.learned {
		if !slices.Contains(keep, i) {
			f.forgot = append(f.forgot, i)
			delete(f.learned, i)
		}
	}
	return nil
}

func (f *fakeGuard) LearnedElements(context.Context) ([]firewall.LearnedElement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []firewall.LearnedElement
	for iface, m := range f.learned {
		for a, ttl := range m {
			out = append(out, firewall.LearnedElement{Iface: iface, Addr: a, Expires: ttl})
		}
	}
	return out, nil
}

// fakeUpstream answers A queries from a table and counts every query.
type fakeUpstream struct {
	mu      sync.Mutex
	answers map[string][]dns.RR
	asked   []string
}

func (u *fakeUpstream) Exchange(_ context.Context, m *dns.Msg) (*dns.Msg, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.asked = append(u.asked, m.Question[0].Name)
	r := new(dns.Msg)
	r.SetReply(m)
	rrs, ok := u.answers[m.Question[0].Name]
	if !ok {
		r.Rcode = dns.RcodeNameError
	}
	for _, rr := range rrs {
		r.Answer = append(r.Answer, dns.Copy(rr))
	}
	return r, nil
}

func (u *fakeUpstream) queries() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.asked)
}
