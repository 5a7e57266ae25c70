package daemon

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestRunKeepsEgressPolicies: the daemon starts with the policies a
// previous run persisted already in the guard's table (READY comes with
// them in force), serves its resolver and proxy in the guard's namespace,
// and a change through the API's egress part is persisted for the next
// run.
func TestRunKeepsEgressPolicies(t *testing.T) {
	ns := testkit.NewNetNS(t, "pdn").Handle()
	cfg := config.Default()
	testParts(t, &cfg)
	state := `{"version": 1, "zones": [{"zone": "sb-aaaa", "owner": "sb-aaaa", "bridges": ["vnetq"],
		"policy": {"mode": "none"}}]}`
	if err := os.WriteFile(cfg.Egress.StateFile, []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(check func(eg *Egress)) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ready := make(chan struct{})
		var eg *Egress
		d := &Daemon{Config: cfg, GuardOptions: []firewall.Option{firewall.WithNetNS(ns)}, EgressNS: &ns,
			Ready: func() { close(ready) }}
		d.egressHook = func(e *Egress) { eg = e }
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("Run ended before ready: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("no readiness")
		}
		check(eg)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	none := func() []string {
		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseLasting()
		set, err := c.GetSetByName(&nftables.Table{Name: firewall.TableName, Family: nftables.TableFamilyINet}, firewall.SetEgressNone)
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(set)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range els {
			out = append(out, string(trimNUL(e.Key)))
		}
		slices.Sort(out)
		return out
	}
	run(func(eg *Egress) {
		if got := none(); !slices.Equal(got, []string{"vnetq"}) {
			t.Errorf("egress_none at readiness: %v, want the persisted vnetq", got)
		}
		if err := eg.Set(context.Background(), "sb-bbbb", "sb-bbbb", []string{"vnetr"}, apitype.EgressPolicy{Mode: "none"}); err != nil {
			t.Fatal(err)
		}
		if got := none(); !slices.Equal(got, []string{"vnetq", "vnetr"}) {
			t.Errorf("egress_none after Set: %v", got)
		}
	})
	run(func(*Egress) {
		if got := none(); !slices.Equal(got, []string{"vnetq", "vnetr"}) {
			t.Errorf("egress_none after a restart: %v, want both persisted policies", got)
		}
	})
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
