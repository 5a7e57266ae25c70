package pveapi_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestEditsCommitted: a client's SDN edits count as committed only once
// another client's apply has committed every one of them, its subnet
// included; the edits it checked are then taken, and a client with no
// edits says false (its apply is a retry that must run).
func TestEditsCommitted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	fb := pveemu.NewFakeBackend(filepath.Join(dir, "run"))
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), StatsInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); _ = s.Close(); _ = fb.Close() })
	client := func(name string) *pveapi.Client {
		id, secret, err := s.RootToken(name)
		if err != nil {
			t.Fatal(err)
		}
		c, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	mine, other := client("mine"), client("other")
	committed := func(want bool) {
		t.Helper()
		if got, err := mine.EditsCommitted(ctx); err != nil || got != want {
			t.Fatalf("EditsCommitted = %v, %v; want %v", got, err, want)
		}
	}
	committed(false) // no edits
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(mine.CreateZone(ctx, sandbox.ZoneSpec{ID: "za"}))
	must(mine.CreateVNet(ctx, sandbox.VNetSpec{ID: "va", Zone: "za"}))
	committed(false) // pending
	must(other.ApplySDN(ctx))
	must(mine.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "va", CIDR: "10.9.0.0/24", Gateway: "10.9.0.1"}))
	committed(false) // zone and vnet committed by the other, the subnet pending
	must(other.ApplySDN(ctx))
	committed(true)
	committed(false) // taken
	must(mine.DeleteSubnet(ctx, "va", "10.9.0.0/24"))
	must(mine.DeleteVNet(ctx, "va"))
	must(mine.DeleteZone(ctx, "za"))
	committed(false) // deletions pending
	must(other.ApplySDN(ctx))
	committed(true)
}
