package sandboxapi_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// fakeEgress records what the API asks of the egress part; at each Set it
// notes whether any VM of the sandbox was already running.
type fakeEgress struct {
	mu       sync.Mutex
	sets     []egressCall
	removed  []string
	policies map[string]apitype.EgressPolicy
	running  func(sandbox string) bool
}

type egressCall struct {
	sandbox, zone string
	bridges       []string
	policy        apitype.EgressPolicy
	vmsRunning    bool
}

// Validate takes the modes firewall.ParseEgressMode takes ("" is open).
func (f *fakeEgress) Validate(p apitype.EgressPolicy) error {
	if p.Mode != "" && p.Mode != "open" && p.Mode != "allowlist" && p.Mode != "none" {
		return errors.New("egress mode entry: want open, allowlist or none")
	}
	return nil
}

func (f *fakeEgress) Set(_ context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, egressCall{sandbox, zone, bridges, p, f.running != nil && f.running(sandbox)})
	f.policies[sandbox] = p
	return nil
}

func (f *fakeEgress) Remove(_ context.Context, sandbox, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, sandbox)
	delete(f.policies, sandbox)
	return nil
}

func (f *fakeEgress) Status(sandbox, _ string) apitype.EgressStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return apitype.EgressStatus{Sandbox: sandbox, Policy: f.policies[sandbox], Denials: []apitype.EgressDenial{}}
}

func TestEgressAPI(t *testing.T) {
	fe := &fakeEgress{policies: map[string]apitype.EgressPolicy{}}
	e := newEnv(t, func(o *options) { o.Egress = fe })
	fe.running = func(sandbox string) bool {
		for _, id := range e.px.VMIDs() {
			v, _ := e.px.VMByID(id)
			if slices.Contains(v.Info.Tags, "pvei-s-"+sandbox) && v.Info.Status == "running" {
				return true
			}
		}
		return false
	}
	ctx := e.ctx()
	req := twoVMs()
	req.Egress = &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{"pypi.org"}}
	sb := e.create(req)
	if len(fe.sets) != 1 {
		t.Fatalf("egress sets at create: %+v", fe.sets)
	}
	c := fe.sets[0]
	if c.sandbox != sb.ID || c.zone != sb.Zone || !slices.Equal(c.bridges, []string{sb.Networks[0].VNet}) || c.policy.Mode != "allowlist" || c.vmsRunning {
		t.Errorf("create's egress call %+v (the policy must be in force before any VM runs)", c)
	}
	if !fe.running(sb.ID) {
		t.Fatal("the running-VM probe of the fake sees no running VM after create (the check above would be vacuous)")
	}
	// without an egress object a sandbox is explicitly open
	plain := e.create(twoVMs())
	if got := fe.sets[len(fe.sets)-1]; got.sandbox != plain.ID || got.policy.Mode != "open" {
		t.Errorf("create without egress: %+v", got)
	}
	st, err := e.c.SetEgress(ctx, sb.ID, apitype.EgressPolicy{Mode: "none"})
	if err != nil || st.Policy.Mode != "none" || st.Sandbox != sb.ID {
		t.Fatalf("PUT egress: %+v %v", st, err)
	}
	if st, err := e.c.Egress(ctx, sb.ID); err != nil || st.Policy.Mode != "none" {
		t.Fatalf("GET egress: %+v %v", st, err)
	}
	// bad input: a clear error naming the field, nothing changed
	n := len(fe.sets)
	_, err = e.c.SetEgress(ctx, sb.ID, apitype.EgressPolicy{Mode: "closed"})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || p.Field != "egress" || !strings.Contains(p.Detail, "mode") {
		t.Errorf("bad policy: %v", err)
	}
	bad := twoVMs()
	bad.Egress = &apitype.EgressPolicy{Mode: "closed"}
	if _, err := e.c.Create(ctx, bad); !client.IsProblem(err, apitype.ProblemInvalidRequest) {
		t.Errorf("create with a bad policy: %v", err)
	}
	if len(fe.sets) != n {
		t.Errorf("a refused request reached the egress part: %+v", fe.sets[n:])
	}
	if _, err := e.c.SetEgress(ctx, "sb-nope", apitype.EgressPolicy{Mode: "none"}); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(fe.removed, sb.ID) {
		t.Errorf("delete did not remove the policy: %v", fe.removed)
	}
}

func TestEgressRefusedWhenDisabled(t *testing.T) {
	e := newEnv(t, nil)
	req := twoVMs()
	req.Egress = &apitype.EgressPolicy{Mode: "none"}
	if _, err := e.c.Create(e.ctx(), req); !client.IsProblem(err, apitype.ProblemInvalidRequest) {
		t.Errorf("create with egress on a node without egress: %v", err)
	}
}
