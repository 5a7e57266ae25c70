// Package tenants_test is the two-tenant suite of issue 34 on the
// playground's real daemon (testvm/tenantbed): TestTwoTenants. It needs
// root and builds the playground's binaries itself.
package tenants_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/tenantbed"
)

// buildBins builds the playground and the binaries it runs into a
// temporary directory.
func buildBins(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+"/",
		"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd",
		"github.com/pve-inspect/pve-inspect/cmd/pve-inspect-probe",
		"github.com/pve-inspect/pve-inspect/cmd/pve-inspect-demo")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// allowlist is an egress policy allowing names only.
func allowlist(names ...string) *apitype.EgressPolicy {
	return &apitype.EgressPolicy{Mode: "allowlist", Allow: names}
}

// create creates a sandbox with c and has the test's end delete it.
func create(t *testing.T, ctx context.Context, c *client.Client, req apitype.CreateRequest) apitype.Sandbox {
	t.Helper()
	sb, err := c.Create(ctx, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { deleteIfThere(t, c, sb.ID) })
	return sb
}

func deleteIfThere(t *testing.T, c *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Delete(ctx, id); err != nil && !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("cleanup: delete %s: %v", id, err)
	}
}

// guestAddr is the IPv4 address of guest vmid, read in its namespace.
func guestAddr(t *testing.T, n *tenantbed.Node, vmid int) string {
	t.Helper()
	var addr string
	err := tenantbed.Do(n.GuestNS(vmid), func() error {
		as, err := net.InterfaceAddrs()
		if err != nil {
			return err
		}
		for _, a := range as {
			if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
				addr = ip.IP.String()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("address of guest %d: %v", vmid, err)
	}
	return addr
}

// probe is one of tenant B's probes.
type probe struct {
	name string
	run  func(context.Context) (time.Duration, error)
}

func probes(p *tenantbed.Prober) []probe {
	return []probe{
		{"exec", p.Exec}, {"file", p.File}, {"dns", p.DNS}, {"proxy", p.Proxy},
		{"node-api", p.NodeAPI}, {"daemon-api", p.DaemonAPI},
	}
}

// runProbes runs every probe rounds times, each as a subtest that fails
// on the first error (a refusal, a stall past the probe's bound or a
// wrong answer; never a slow success), and one event cycle (a sandbox of
// B created and deleted, its events on B's stream).
func runProbes(t *testing.T, ctx context.Context, p *tenantbed.Prober, rounds int, shape apitype.CreateRequest) {
	for _, pr := range probes(p) {
		t.Run(pr.name, func(t *testing.T) {
			for i := range rounds {
				if _, err := pr.run(ctx); err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
			}
		})
	}
	t.Run("events", func(t *testing.T) {
		if _, err := p.EventCycle(ctx, shape); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTwoTenants is the two-tenant suite (issue 34) on the playground's
// real daemon: tenant A, holding an owner-bound token, does its worst
// (floods DNS, the proxy and the network from its guest, holds every
// exec, file and stream it may, poisons its guest's /usr/bin/env and
// tools, sends an output far over its limit), while tenant B's exec,
// file, DNS, proxy and events and the node's and the daemon's APIs keep
// answering; A is deleted and B's next sandbox gets A's VMID and network
// and sees nothing of A. Every property is a subtest of its own; tests
// assert answers, never times.
func TestTwoTenants(t *testing.T) {
	testkit.RequireRoot(t, "ip", "nft", "dnsmasq", "go")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n, err := tenantbed.Start(ctx, buildBins(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	tokA, err := n.Token(ctx, "tenant-a", "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	tokB, err := n.Token(ctx, "tenant-b", "tenant-b")
	if err != nil {
		t.Fatal(err)
	}
	a, b := n.Client(tokA), n.Client(tokB)

	probeShape := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: tenantbed.Template}}, Egress: allowlist("*." + testvm.InternetName)}
	b0 := create(t, ctx, b, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: tenantbed.Template}},
		Egress: allowlist("*."+testvm.InternetName, testvm.InternetName)})
	p, err := tenantbed.NewProber(ctx, n, b, b0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("tenant B's event stream: %v", err)
		}
	})
	// Positive control: every probe works with nobody attacking.
	if !t.Run("B alone", func(t *testing.T) { runProbes(t, ctx, p, 2, probeShape) }) {
		t.Fatalf("tenant B's probes fail with nobody attacking: the bed is broken, not the tenants\n%s", lastLines(n.Output(), 30))
	}

	// A's sandbox: the shape B's next one will have.
	shape := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: tenantbed.Template}}}
	reqA := shape
	reqA.Labels = map[string]string{"mark": tenantbed.MarkLabel}
	reqA.Egress = allowlist("*." + testvm.InternetName)
	sa := create(t, ctx, a, reqA)
	vmidA, netA := sa.VMs[0].VMID, sa.Networks
	addrA := guestAddr(t, n, vmidA)
	att, err := tenantbed.StartAttack(ctx, a, sa, tenantbed.AttackOptions{Flood: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { att.Stop() })

	t.Run("B works while A attacks", func(t *testing.T) { runProbes(t, ctx, p, 5, probeShape) })

	st := att.Stop()
	t.Logf("tenant A held %d execs (refused: %s), %d file writes (refused: %s), %d event streams of %d ids each (refused: %s); flood: %s",
		st.ExecsHeld, st.ExecRefusal, st.FilesHeld, st.FileRefusal, st.StreamsHeld, st.FilterIDs, st.StreamRefusal, st.Flood)
	t.Run("A is refused at its quotas", func(t *testing.T) {
		for _, q := range []struct{ what, refusal string }{{"exec", st.ExecRefusal}, {"file", st.FileRefusal}, {"event stream", st.StreamRefusal}} {
			switch {
			case q.refusal == "":
				t.Errorf("%s: never refused: one owner may hold as many as it likes", q.what)
			case strings.HasPrefix(q.refusal, "not a refusal"):
				t.Errorf("%s: %s", q.what, q.refusal)
			}
		}
	})
	ran, err := tenantbed.Poison(ctx, a, sa)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tenant A's poisoned `true` ran in its own guest: %v", ran)
	if err := a.Delete(ctx, sa.ID); err != nil {
		t.Fatalf("delete A: %v", err)
	}

	// B's next sandbox, of A's shape, right after.
	b1 := create(t, ctx, b, apitype.CreateRequest{VMs: shape.VMs, Egress: allowlist("b-only." + testvm.InternetName)})
	vm := b1.VMs[0].Name
	t.Run("B gets A's place", func(t *testing.T) {
		if b1.VMs[0].VMID != vmidA {
			t.Errorf("B's VMID %d, A had %d", b1.VMs[0].VMID, vmidA)
		}
		if len(b1.Networks) != len(netA) || len(netA) == 0 || b1.Networks[0].CIDR != netA[0].CIDR {
			t.Errorf("B's networks %+v, A had %+v", b1.Networks, netA)
		}
		if addrB := guestAddr(t, n, b1.VMs[0].VMID); addrB != addrA || addrA == "" {
			t.Errorf("B's address %q, A had %q", addrB, addrA)
		}
	})
	t.Run("B sees nothing of A", func(t *testing.T) {
		t.Run("env", func(t *testing.T) {
			res, err := b.Exec(ctx, b1.ID, vm, apitype.ExecRequest{Argv: []string{"env"}})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{tenantbed.MarkVar, tenantbed.MarkPath, "BASH_ENV", "BASH_FUNC_"} {
				if bytes.Contains(res.Stdout, []byte(s)) {
					t.Errorf("an argv exec in B runs with A's %s:\n%s", s, res.Stdout)
				}
			}
			if _, err := b.Exec(ctx, b1.ID, vm, apitype.ExecRequest{Argv: []string{"bash", "-c", "true"}}); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if _, err := b.ReadFile(ctx, b1.ID, vm, tenantbed.MarkRan, &got); !client.IsProblem(err, apitype.ProblemFileNotFound) {
				t.Errorf("A's code ran in B (%s: %q, %v)", tenantbed.MarkRan, got.String(), err)
			}
		})
		t.Run("files", func(t *testing.T) {
			var got bytes.Buffer
			if _, err := b.ReadFile(ctx, b1.ID, vm, tenantbed.MarkFile, &got); !client.IsProblem(err, apitype.ProblemFileNotFound) {
				t.Errorf("B reads A's %s: %q, %v", tenantbed.MarkFile, got.String(), err)
			}
		})
		t.Run("names", func(t *testing.T) {
			l, err := b.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range l {
				if s.ID == sa.ID || s.Owner != "tenant-b" || s.Labels["mark"] == tenantbed.MarkLabel {
					t.Errorf("B lists %+v", s)
				}
			}
			if _, err := b.Get(ctx, sa.ID); !client.IsProblem(err, apitype.ProblemNotFound) {
				t.Errorf("B gets A's sandbox %s: %v, want not-found", sa.ID, err)
			}
		})
		t.Run("learned addresses", func(t *testing.T) {
			pb, err := tenantbed.NewProber(ctx, n, b, b1)
			if err != nil {
				t.Fatal(err)
			}
			defer pb.Close()
			// A resolved names to the internet host from this VMID's
			// port; B has resolved nothing yet, so nothing may pass.
			if _, status, err := pb.HTTP("b-only."+testvm.InternetName, 3*time.Second); err == nil {
				t.Errorf("B reaches %s:80 before resolving anything (%q): A's learned address outlived A", testvm.InternetAddr, status)
			}
			// Positive control: once B resolves its allowed name it passes.
			if _, _, addrs, err := pb.Resolve("b-only." + testvm.InternetName); err != nil || len(addrs) == 0 {
				t.Fatalf("B resolves its allowed name: %v %v", addrs, err)
			}
			if _, status, err := pb.HTTP("b-only."+testvm.InternetName, 10*time.Second); err != nil || !strings.HasPrefix(status, "HTTP/1.1 200") {
				t.Errorf("B after resolving: %q, %v", status, err)
			}
		})
		t.Run("events", func(t *testing.T) {
			// Positive control: b1's ready event, published before its
			// create returned, reaches B's stream (a minute; the stream
			// delivers it after the create's answer).
			evs := p.Events()
			for deadline := time.Now().Add(time.Minute); !slices.ContainsFunc(evs, func(e tenantbed.Received) bool {
				return e.Sandbox == b1.ID && e.Type == apitype.EventReady
			}); evs = p.Events() {
				if time.Now().After(deadline) || p.StreamErr() != nil {
					t.Fatalf("B's stream has no ready event of B's own %s (positive control; stream: %v)", b1.ID, p.StreamErr())
				}
				time.Sleep(50 * time.Millisecond)
			}
			for _, e := range evs {
				if e.Sandbox == sa.ID || e.Owner == "tenant-a" {
					t.Errorf("B's stream carries A's event %+v", e.Event)
				}
			}
		})
		t.Run("metrics", func(t *testing.T) {
			m, err := n.Metrics(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(m, "\n") {
				if !strings.HasPrefix(l, "#") && strings.Contains(l, `"`+sa.ID+`"`) {
					t.Errorf("a series of A's deleted sandbox remains: %s", l)
				}
			}
		})
		t.Run("denials", func(t *testing.T) {
			for _, id := range []string{b0.ID, b1.ID} {
				es, err := b.Egress(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range es.Denials {
					if strings.Contains(d.Name, "tenant-a") || strings.Contains(d.Name, "."+testvm.InternetName) {
						t.Errorf("B's %s shows A's denial %+v", id, d)
					}
				}
			}
		})
	})
	t.Run("B works after A", func(t *testing.T) { runProbes(t, ctx, p, 2, probeShape) })
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
