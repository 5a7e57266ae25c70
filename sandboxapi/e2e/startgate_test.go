package e2e_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestStartWaitsOutAnotherApply: The engine bounds a create's own
// work by CreateTimeout before its SDN apply and afresh after it, the
// wait for an apply apart (ApplyTimeout). But the wait of the create's VM
// start for the start gate (Engine.starts, which an apply of this engine
// holds whole across its PUT /cluster/sdn) is an apply wait too, and it
// runs on the post-apply context (CreateTimeout): an apply of another
// sandbox's delete (or create, or the pool's refill) that outlasts
// CreateTimeout fails every create that reaches its start meanwhile, as
// TestCreateOutlastsItsApply did for the create's own apply. Here sandbox
// B's create is held at its clone until sandbox A's delete has started
// its apply (longer than CreateTimeout); B then waits at the gate (it
// failed with "start vm ...: waiting for this node's SDN apply: context
// deadline exceeded" before the gate paused the create's budget).
func TestStartWaitsOutAnotherApply(t *testing.T) {
	var (
		armed    atomic.Bool
		cloned   atomic.Bool
		once     sync.Once
		applying = make(chan struct{})
		env      *emuEnv
		delA     = make(chan error, 1)
		idA      atomic.Value
	)
	env = newEmuEnvWith(t, emuSetup{
		reloadCost: pveemu.ReloadCost{PerNode: 1500 * time.Millisecond},
		opts:       []func(*options){func(o *options) { o.CreateTimeout = time.Second }},
		wrap: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if cloned.Load() && r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/cluster/sdn") {
					select {
					case <-applying:
					default:
						close(applying)
					}
				}
				if armed.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/clone") {
					once.Do(func() {
						cloned.Store(true)
						go func() { delA <- env.c.Delete(context.Background(), idA.Load().(string)) }()
						select {
						case <-applying:
						case <-time.After(30 * time.Second):
						}
					})
				}
				h.ServeHTTP(w, r)
			})
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, err := env.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create A: %v", err)
	}
	idA.Store(a.ID)
	armed.Store(true)
	b, err := env.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Errorf("create B, whose start met A's delete's apply (longer than CreateTimeout, shorter than ApplyTimeout): %v", err)
	} else if err := env.c.Delete(ctx, b.ID); err != nil {
		t.Error(err)
	}
	if err := <-delA; err != nil {
		t.Errorf("delete A: %v", err)
	}
}
