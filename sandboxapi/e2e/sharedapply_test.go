package e2e_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestCreateSharesAnotherClientsApply: on a cluster, another node's daemon
// applies the SDN configuration right after this create wrote its zone,
// vnet and subnet; that apply commits them and its worker reloads this
// node too. The create leaves its own apply out and waits for the bridge
// with its gateway (issue 36: every node's creates share one apply where
// they can). When the other apply's reload of this node fails, the create
// waits for it in vain and applies itself.
func TestCreateSharesAnotherClientsApply(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lostReload  bool
		wantApplies int64 // PUT /cluster/sdn during the create, the other client's included
	}{
		{"the other apply reaches the node", false, 1},
		{"the other apply's reload of the node fails", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				applies atomic.Int64
				other   *pveapi.Client
				once    sync.Once
				armed   atomic.Bool
			)
			e := newEmuEnvWith(t, emuSetup{wrap: func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/cluster/sdn") {
						applies.Add(1)
					}
					h.ServeHTTP(w, r)
					// The create's last SDN edit is its subnet: the other
					// client's apply comes right after it.
					if armed.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/subnets") {
						once.Do(func() { _ = other.ApplySDN(r.Context()) })
					}
				})
			}})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			other = rootClient(t, e.emu, e.url, e.hc, "other-node")
			if tc.lostReload {
				e.emu.InjectReloadWarning("reloading network config failed: ifreload -a: exit code 1")
			}
			armed.Store(true)
			sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			armed.Store(false)
			if got := applies.Load(); got != tc.wantApplies {
				t.Errorf("%d SDN applies during the create, want %d", got, tc.wantApplies)
			}
			if got, err := e.c.Get(ctx, sb.ID); err != nil || got.State != apitype.StateReady {
				t.Fatalf("sandbox: %+v %v", got, err)
			}
			if v, ok := e.fb.VNet(sb.Networks[0].VNet); !ok || v.Gateway.String() != sb.Networks[0].Gateway {
				t.Errorf("vnet %s on the node: %+v %v, want gateway %s", sb.Networks[0].VNet, v, ok, sb.Networks[0].Gateway)
			}
			if err := e.c.Delete(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			e.assertClean(t, ctx)
		})
	}
}
