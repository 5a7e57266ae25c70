package sandboxapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

func TestDeleteDuringCreate(t *testing.T) {
	e := newEnv(t, func(o *options) { o.AgentTimeout = time.Minute })
	for id := 100; id < 110; id++ {
		e.guests.PingFails[id] = true // agents never answer: create waits
	}
	var wg sync.WaitGroup
	var cerr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, cerr = e.c.Create(context.Background(), twoVMs())
	}()
	var id string
	deadline := time.Now().Add(10 * time.Second)
	for id == "" {
		if l, _ := e.c.List(e.ctx()); len(l) == 1 && l[0].State == apitype.StateCreating && len(e.px.VMIDs()) == 2 {
			id = l[0].ID
		}
		if time.Now().After(deadline) {
			t.Fatal("create did not get going")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.c.Delete(e.ctx(), id); err != nil {
		t.Fatalf("delete during create: %v", err)
	}
	wg.Wait()
	if cerr == nil {
		t.Fatal("create succeeded although it was deleted")
	}
	if ids := e.px.VMIDs(); len(ids) != 0 {
		t.Errorf("VMs left: %v", ids)
	}
	if z, v, s := e.px.SDNObjects(); z+v+s != 0 {
		t.Errorf("sdn left %d/%d/%d", z, v, s)
	}
	if _, err := e.c.Get(e.ctx(), id); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("get after delete: %v", err)
	}
}

func TestExtendAndCheckErrors(t *testing.T) {
	e := newEnv(t, func(o *options) { o.Checker = nil })
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if _, err := e.c.Check(e.ctx(), sb.ID, ""); !client.IsProblem(err, apitype.ProblemUnavailable) {
		t.Errorf("check without checker: %v", err)
	}
	if _, err := e.c.Check(e.ctx(), sb.ID, "nosuch"); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("check from unknown vm: %v", err)
	}
	if _, err := e.c.Extend(e.ctx(), "sbzzzzzz", time.Hour); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("extend unknown: %v", err)
	}
	h, err := e.c.Health(e.ctx())
	if err != nil || h.Status != "ok" || h.Sandboxes != 1 || h.Node != "node1" {
		t.Errorf("health %+v %v", h, err)
	}
}

// BenchmarkExec compares an exec through the HTTP API with the same call
// made on the guest directly, in one run; the difference is the API's
// overhead (HTTP, JSON, routing, auth, metrics).
func BenchmarkExec(b *testing.B) {
	e := newEnv(b, nil)
	sb, err := e.c.Create(context.Background(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		b.Fatal(err)
	}
	g := e.guests.Dial("/x/" + strconv.Itoa(sb.VMs[0].VMID) + ".qga")
	ctx := context.Background()
	b.Run("api", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", "x"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := g.Exec(ctx, sandbox.GuestExec{Argv: []string{"echo", "x"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFileRoundTrip measures 64 MiB write+read through the API against
// the same transfers on the guest directly.
func BenchmarkFileRoundTrip(b *testing.B) {
	e := newEnv(b, nil)
	sb, err := e.c.Create(context.Background(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	g := e.guests.Dial("/x/" + strconv.Itoa(sb.VMs[0].VMID) + ".qga")
	ctx := context.Background()
	var buf bytes.Buffer
	b.Run("api", func(b *testing.B) {
		b.SetBytes(2 * int64(len(data)))
		for b.Loop() {
			if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/f", bytes.NewReader(data), int64(len(data)), 0); err != nil {
				b.Fatal(err)
			}
			buf.Reset()
			if _, err := e.c.ReadFile(ctx, sb.ID, "vm0", "/f", &buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(2 * int64(len(data)))
		for b.Loop() {
			if err := g.WriteFile(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
				b.Fatal(err)
			}
			buf.Reset()
			if _, err := g.ReadFile(ctx, "/f", &buf, 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestZonesChanged(t *testing.T) {
	var mu sync.Mutex
	var calls []map[string][]string
	hook := func(_ context.Context, z map[string][]string) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, z)
		return nil
	}
	e := newEnv(t, func(o *options) { o.ZonesChanged = hook })
	last := func() map[string][]string {
		mu.Lock()
		defer mu.Unlock()
		if len(calls) == 0 {
			return nil
		}
		return calls[len(calls)-1]
	}
	if z := last(); z == nil || len(z) != 0 {
		t.Fatalf("after reconcile: %v", z)
	}
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Networks: []string{"a", "b"}}},
		Networks: []apitype.NetworkRequest{{Name: "a"}, {Name: "b"}}})
	if z := last(); len(z) != 1 || len(z[sb.ID]) != 2 || z[sb.ID][0] != sb.Networks[0].VNet || z[sb.ID][1] != sb.Networks[1].VNet {
		t.Fatalf("after create: %v", z)
	}
	if err := e.c.Delete(e.ctx(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if z := last(); len(z) != 0 {
		t.Fatalf("after delete: %v", z)
	}
	// a failing hook fails the create, which leaves nothing behind
	e.opts.ZonesChanged = nil
	e2 := newEnv(t, func(o *options) {
		o.ZonesChanged = func(_ context.Context, z map[string][]string) error {
			if len(z) > 0 {
				return errors.New("guard refused")
			}
			return nil
		}
	})
	if _, err := e2.c.Create(e2.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}); err == nil {
		t.Fatal("create succeeded although the zone hook failed")
	}
	if ids := e2.px.VMIDs(); len(ids) != 0 {
		t.Errorf("VMs left: %v", ids)
	}
	if z, v, s := e2.px.SDNObjects(); z+v+s != 0 {
		t.Errorf("sdn left %d/%d/%d", z, v, s)
	}
}
