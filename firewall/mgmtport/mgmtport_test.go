package mgmtport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeFW keeps rules like Proxmox: a list, new rules inserted at position 0.
type fakeFW struct {
	mu            sync.Mutex
	rules         []Rule
	node, cluster bool
	adds, dels    int
	failAdd       error
}

func (f *fakeFW) renumber() {
	for i := range f.rules {
		f.rules[i].Pos = i
	}
}

// digest changes with every change of the list, like the digest of
// host.fw.
func (f *fakeFW) digest() string { return fmt.Sprintf("%d-%d", f.adds, f.dels) }

func (f *fakeFW) NodeRules(context.Context) ([]Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.rules)
	for i := range out {
		out[i].Digest = f.digest()
	}
	return out, nil
}
func (f *fakeFW) AddNodeRule(_ context.Context, r Rule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd != nil {
		return f.failAdd
	}
	f.adds++
	f.rules = append([]Rule{r}, f.rules...)
	f.renumber()
	return nil
}
func (f *fakeFW) DeleteNodeRule(_ context.Context, pos int, digest string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if digest != f.digest() {
		return fmt.Errorf("digest %q, list is at %q: detected modified configuration", digest, f.digest())
	}
	if pos < 0 || pos >= len(f.rules) {
		return errors.New("no such rule")
	}
	f.dels++
	f.rules = slices.Delete(f.rules, pos, pos+1)
	f.renumber()
	return nil
}
func (f *fakeFW) NodeFirewallEnabled(context.Context) (bool, error)    { return f.node, nil }
func (f *fakeFW) SetNodeFirewall(_ context.Context, on bool) error     { f.node = on; return nil }
func (f *fakeFW) ClusterFirewallEnabled(context.Context) (bool, error) { return f.cluster, nil }

func ours(rules []Rule) []Rule {
	var out []Rule
	for _, r := range rules {
		if len(r.Comment) >= len(Tag) && r.Comment[:len(Tag)] == Tag {
			r.Pos = 0
			out = append(out, r)
		}
	}
	return out
}

func TestConverge(t *testing.T) {
	foreign := Rule{Type: "in", Action: "ACCEPT", Proto: "tcp", DPort: "3128", Comment: "operator", Enable: true}
	fw := &fakeFW{rules: []Rule{foreign}, cluster: true} // root turned the cluster firewall on
	c := New(fw, 8443, nil)
	ctx := context.Background()

	changed, err := c.Converge(ctx, "eth0")
	if err != nil || !changed {
		t.Fatalf("first converge: %v %v", changed, err)
	}
	want := c.Desired("eth0")
	if got := ours(fw.rules); !slices.EqualFunc(got, want, same) {
		t.Fatalf("rules %+v, want %+v", got, want)
	}
	if len(want) != 9 || want[2].DPort != "8443" || want[0].Iface != "eth0" || want[3].Iface != "" {
		t.Errorf("desired set %+v", want)
	}
	// the node's replies from the management ports, stateless out of the
	// default-route interface (untracked under the guard's mgmt-notrack)
	if r := want[6]; r.Type != "out" || r.SPort != "8006" || r.DPort != "" || r.Iface != "eth0" || want[7].SPort != "22" || want[8].SPort != "8443" {
		t.Errorf("desired set %+v", want)
	}
	if !fw.node || !fw.cluster {
		t.Error("firewall not enabled")
	}
	if fw.rules[len(fw.rules)-1] != (Rule{Pos: len(fw.rules) - 1, Type: "in", Action: "ACCEPT", Proto: "tcp", DPort: "3128", Comment: "operator", Enable: true}) {
		t.Errorf("foreign rule moved or changed: %+v", fw.rules)
	}

	// converged: nothing is recreated
	adds, dels := fw.adds, fw.dels
	if changed, err := c.Converge(ctx, "eth0"); err != nil || changed || fw.adds != adds || fw.dels != dels {
		t.Fatalf("second converge changed things: %v %v", changed, err)
	}

	// someone edits one of ours: recreated
	fw.rules[1].DPort = "23"
	if changed, _ := c.Converge(ctx, "eth0"); !changed || !slices.EqualFunc(ours(fw.rules), want, same) {
		t.Fatalf("edited rule not repaired: %+v", fw.rules)
	}

	// default route moves
	if changed, _ := c.Converge(ctx, "ens5"); !changed || !slices.EqualFunc(ours(fw.rules), c.Desired("ens5"), same) {
		t.Fatalf("iface change not applied: %+v", fw.rules)
	}
	if n := len(fw.rules); n != 10 {
		t.Errorf("%d rules, want 9 ours + 1 foreign", n)
	}

	// errors are returned
	fw.rules[0].DPort = "1"
	fw.failAdd = errors.New("boom")
	if _, err := c.Converge(ctx, "ens5"); err == nil {
		t.Error("failure not reported")
	}
}

// TestConvergeClusterOff: with the cluster firewall off the rules and the
// node switch are still put in place, the cluster switch is left to root
// and the converger says what to run.
func TestConvergeClusterOff(t *testing.T) {
	fw := &fakeFW{}
	c := New(fw, 0, nil)
	changed, err := c.Converge(context.Background(), "eth0")
	if !errors.Is(err, ErrClusterFirewallOff) || !changed {
		t.Fatalf("converge with the cluster firewall off: %v %v", changed, err)
	}
	if !strings.Contains(err.Error(), "pvesh set /cluster/firewall/options --enable 1") {
		t.Errorf("error names no fix: %v", err)
	}
	if fw.cluster || !fw.node || !slices.EqualFunc(ours(fw.rules), c.Desired("eth0"), same) {
		t.Errorf("cluster %v node %v rules %+v", fw.cluster, fw.node, fw.rules)
	}
}

// TestConvergeStaleDigest: a delete whose list changed meanwhile is
// refused by Proxmox; the converger reports it and repairs next round.
func TestConvergeStaleDigest(t *testing.T) {
	fw := &fakeFW{cluster: true}
	c := New(fw, 0, nil)
	ctx := context.Background()
	if _, err := c.Converge(ctx, "eth0"); err != nil {
		t.Fatal(err)
	}
	rules, _ := fw.NodeRules(ctx)
	fw.rules = append([]Rule{{Type: "in", Action: "DROP", Comment: "operator"}}, fw.rules...) // another writer
	fw.adds++
	fw.renumber()
	if err := fw.DeleteNodeRule(ctx, rules[0].Pos, rules[0].Digest); err == nil {
		t.Fatal("delete with a stale digest accepted")
	}
	if changed, err := c.Converge(ctx, "eth1"); err != nil || !changed || !slices.EqualFunc(ours(fw.rules), c.Desired("eth1"), same) {
		t.Fatalf("converge after a foreign change: %v %v %+v", changed, err, fw.rules)
	}
	if fw.rules[len(fw.rules)-1].Comment != "operator" {
		t.Errorf("foreign rule lost: %+v", fw.rules)
	}
}

func TestRunFollowsInterface(t *testing.T) {
	fw := &fakeFW{}
	c := New(fw, 0, nil)
	ch := make(chan string)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, "eth0", ch, time.Hour); close(done) }()
	ch <- "eth1" // accepted only after the first round
	deadline := time.Now().Add(time.Minute)
	for {
		fw.mu.Lock()
		got := ours(fw.rules)
		fw.mu.Unlock()
		if slices.EqualFunc(got, c.Desired("eth1"), same) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rules did not follow the interface: %+v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}

// TestDesiredNotrackedReplies: every port the guard notracks gets one node
// OUT rule for its replies (sorted, once), and no IN rule: 8006, 22 and
// the API port keep their named rules.
func TestDesiredNotrackedReplies(t *testing.T) {
	var in, out []string
	for _, r := range New(nil, 8443, nil, 9474, 22, 3128, 8006, 8443, 9474).Desired("vmbr0") {
		switch r.Type {
		case "in":
			if r.Proto == "tcp" && r.Iface != "" {
				in = append(in, r.DPort)
			}
		case "out":
			out = append(out, r.SPort+" "+r.Comment)
		}
	}
	if !slices.Equal(in, []string{"8006", "22", "8443"}) {
		t.Errorf("in rules %v, want 8006 22 8443 only", in)
	}
	want := []string{"8006 " + Tag + " proxmox-api-reply", "22 " + Tag + " ssh-reply", "8443 " + Tag + " sandbox-api-reply",
		"3128 " + Tag + " port-3128-reply", "9474 " + Tag + " port-9474-reply"}
	if !slices.Equal(out, want) {
		t.Errorf("out rules %q, want %q", out, want)
	}
	if rs := New(nil, 8443, nil, 9474).Desired(""); slices.ContainsFunc(rs, func(r Rule) bool { return r.Type == "out" }) {
		t.Errorf("out rules without a default-route interface: %+v", rs)
	}
}
