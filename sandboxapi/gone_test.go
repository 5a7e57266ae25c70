package sandboxapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestHealthSaysTTLs: healthz says the default and the most a create or
// an extend may ask for, so that a client keeping a sandbox alive knows
// how far one extend reaches.
func TestHealthSaysTTLs(t *testing.T) {
	e := newEnv(t, func(o *options) { o.DefaultTTL, o.MaxTTL = 30*time.Minute, 2*time.Hour })
	h, err := e.c.Health(e.ctx())
	if err != nil || h.DefaultTTLSeconds != 1800 || h.MaxTTLSeconds != 7200 {
		t.Fatalf("health %+v %v: want default 1800 and max 7200", h, err)
	}
}

// TestCallEndedByDelete: a call a delete ends answers a conflict saying
// why the sandbox went, in a word (reason) and in its detail: expired at
// its expiry (the reaper), deleted by the token that deleted it.
func TestCallEndedByDelete(t *testing.T) {
	for _, tc := range []struct {
		name   string
		del    func(e *env, id string) error
		reason string
		detail string
	}{
		{"expiry", func(e *env, _ string) error {
			e.clock.Advance(time.Minute)
			e.srv.Engine().Reap(e.ctx())
			return nil
		}, apitype.ReasonExpired, "it expired at 2026-01-01T00:00:30Z (its TTL ran out and nothing extended it)"},
		{"delete call", func(e *env, id string) error {
			return client.New(e.tcp.URL, client.WithToken("a")).Delete(e.ctx(), id)
		}, apitype.ReasonDeleted, `it was deleted by token "tok-a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, TTLSeconds: 30})
			done := make(chan error, 1)
			go func() {
				_, err := e.c.Exec(e.ctx(), sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"block"}, TimeoutSeconds: 600})
				done <- err
			}()
			for deadline := time.Now().Add(10 * time.Second); e.guests.Blocking() == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the exec did not start")
				}
			}
			if err := tc.del(e, sb.ID); err != nil {
				t.Fatal(err)
			}
			var p *apitype.Problem
			if err := <-done; !errors.As(err, &p) {
				t.Fatalf("exec: %v, want a problem", err)
			}
			want := "sandbox " + sb.ID + " was deleted during the call: " + tc.detail
			if p.Type != apitype.ProblemConflict || p.Status != http.StatusConflict || p.Reason != tc.reason || p.Detail != want {
				t.Fatalf("exec: %+v, want a conflict of reason %s saying %q", p, tc.reason, want)
			}
		})
	}
}

// TestValidate: POST /v1/sandboxes/validate lists every refusal of the
// node a create would meet whatever else runs (each a problem document as
// the create's would be), with the templates the node knows; ranges and
// room other sandboxes hold pass; nothing is created. What the request's
// own rules refuse is refused (400) as the create would.
func TestValidate(t *testing.T) {
	var vnetUp atomic.Bool
	e := newEnv(t, func(o *options) {
		o.Caps = sandbox.Caps{SandboxVCPUs: 4, NodeVCPUs: 6}
		o.Egress = &fakeEgress{policies: map[string]apitype.EgressPolicy{}}
		// The host's LAN, and the network the held sandbox's vnet puts on
		// the host (its gateway's).
		o.HostNetworks = func(context.Context) ([]netip.Prefix, error) {
			host := []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}
			if vnetUp.Load() {
				host = append(host, netip.MustParsePrefix("10.9.0.0/24"))
			}
			return host, nil
		}
	})
	held := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Cores: 4}}, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.9.0.0/24"}}})
	vnetUp.Store(true)
	type want struct{ typ, field, cap string }
	for _, tc := range []struct {
		name string
		req  apitype.CreateRequest
		want []want
	}{
		{"valid, its range and room held by another sandbox", apitype.CreateRequest{
			VMs: []apitype.VMRequest{{Template: "kali", Cores: 4}}, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.9.0.0/24"}},
		}, nil},
		{"everything wrong", apitype.CreateRequest{
			VMs:      []apitype.VMRequest{{Template: "debian", Cores: 3}, {Template: "nosuch", Cores: 3}, {Template: "nosuch2"}},
			Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.7.0/25"}},
			Egress:   &apitype.EgressPolicy{Mode: "sideways"},
		}, []want{
			{apitype.ProblemInvalidRequest, "vms[1].template", ""},
			{apitype.ProblemInvalidRequest, "vms[2].template", ""},
			{apitype.ProblemGuardRefused, "", "sandbox_vcpus"},
			{apitype.ProblemInvalidRequest, "egress", ""},
			{apitype.ProblemInvalidRequest, "networks[0].cidr", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.px.Mutations()
			rep, err := client.New(e.tcp.URL, client.WithToken("r")).Validate(e.ctx(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []want
			for _, p := range rep.Problems {
				got = append(got, want{p.Type, p.Field, p.Cap})
				if p.Detail == "" || p.Status == 0 {
					t.Errorf("problem %+v: no detail or status", p)
				}
				// a client maps no network of the node's host through
				// the refusal: the host's 192.168.7.0/24 is not named
				if p.Field == "networks[0].cidr" && (strings.Contains(p.Detail, "192.168.7.0/24") || !strings.Contains(p.Detail, "a network of the node's host")) {
					t.Errorf("the refusal of a cidr on the host's network: %q, want it said without naming the host's network", p.Detail)
				}
			}
			if !slices.Equal(got, tc.want) || rep.Valid != (len(tc.want) == 0) {
				t.Errorf("valid %v, problems %+v, want %+v", rep.Valid, rep.Problems, tc.want)
			}
			if !slices.Equal(rep.Templates, []string{"debian", "kali"}) {
				t.Errorf("templates %v", rep.Templates)
			}
			if e.px.Mutations() != before {
				t.Error("validate changed something in Proxmox")
			}
		})
	}
	// The request's own rules refuse it as the create would.
	_, err := e.c.Validate(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, TTLSeconds: 1 << 40})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Status != http.StatusBadRequest || p.Field != "ttl_seconds" {
		t.Errorf("validate over the max TTL: %v, want invalid-request of field ttl_seconds", err)
	}
	if l, err := e.c.List(e.ctx()); err != nil || len(l) != 1 || l[0].ID != held.ID {
		t.Errorf("sandboxes after validating: %v %v", l, err)
	}
	// A create of the held range waits for it (cidr-in-use), not refused
	// for the host's network its vnet put there.
	_, err = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.9.0.0/25"}}})
	if !errors.As(err, &p) || p.Reason != apitype.ReasonCIDRInUse || p.Field != "networks[0].cidr" {
		t.Errorf("create on the held range: %v, want a conflict of reason %s", err, apitype.ReasonCIDRInUse)
	}
	// A create on the host's LAN is a conflict no wait ends, said without
	// naming the host's network.
	_, err = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.7.128/25"}}})
	if !errors.As(err, &p) || p.Type != apitype.ProblemConflict || p.Reason != "" || strings.Contains(p.Detail, "192.168.7.0/24") || !strings.Contains(p.Detail, "a network of the node's host") {
		t.Errorf("create on the host's network: %v, want a conflict without a reason that does not name the host's network", err)
	}
}
