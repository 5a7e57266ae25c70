package sandboxapi_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

var errEnough = errors.New("enough")

// collect follows the stream of c until it has n events or the deadline.
func collect(t *testing.T, c streamClient, r client.EventsRequest, n int, during func()) []apitype.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []apitype.Event
	done := make(chan error, 1)
	go func() {
		done <- c.Events(ctx, r, func(e apitype.Event) error {
			got = append(got, e)
			if len(got) >= n {
				return errEnough
			}
			return nil
		})
	}()
	// a stream without Last-Event-ID starts at the newest event when it
	// is answered: during publishes only once it was
	select {
	case <-c.opened.Opened:
	case err := <-done:
		t.Fatalf("events: %v before the stream was answered", err)
	}
	if during != nil {
		during()
	}
	if err := <-done; !errors.Is(err, errEnough) {
		t.Fatalf("events: %v after %d of %d: %+v", err, len(got), n, got)
	}
	return got
}

// streamClient is a client whose transport says when an event stream was
// answered.
type streamClient struct {
	*client.Client
	opened *testkit.StreamOpened
}

func types(evs []apitype.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, e.Type)
	}
	return strings.Join(s, ",")
}

// TestEventsAndBroken: the stream carries a sandbox's life and its health
// changes to its owner only; a broken VM refuses exec and file calls at
// once with sandbox-broken and says why in the sandbox's health. "At
// once" is checked without a clock: the refusals make no guest agent
// call (a call to a broken VM's agent is what waits out a timeout).
func TestEventsAndBroken(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	var agentCalls atomic.Int64
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		countGuests(o, &agentCalls)
	})
	mint := func(name, owner string) streamClient {
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		opened := testkit.NewStreamOpened("/v1/events")
		return streamClient{client.New(e.tcp.URL, client.WithToken(tok), client.WithHTTPClient(&http.Client{Transport: opened})), opened}
	}
	alice, bob := mint("alice-agent", "alice"), mint("bob-agent", "bob")
	ctx := e.ctx()
	var sb apitype.Sandbox
	evs := collect(t, alice, client.EventsRequest{}, 2, func() {
		var err error
		if _, err = bob.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}); err != nil {
			t.Fatal(err)
		}
		if sb, err = alice.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}); err != nil {
			t.Fatal(err)
		}
	})
	if types(evs) != "created,ready" || evs[0].Sandbox != sb.ID || evs[1].Owner != "alice" {
		t.Fatalf("alice's stream: %+v", evs)
	}
	eng := e.srv.Engine()
	eng.CheckHealth(ctx)
	vmid := sb.VMs[0].VMID
	evs = collect(t, alice, client.EventsRequest{Sandboxes: []string{sb.ID}, Types: []string{apitype.EventHealth}}, 1, func() {
		e.px.SetVMState(vmid, "stopped", "")
		eng.CheckHealth(ctx)
	})
	if h := evs[0].Health; h == nil || h.State != apitype.HealthBroken || h.Reason != apitype.ReasonVMStopped {
		t.Fatalf("health event %+v", evs[0])
	}
	got, err := alice.Get(ctx, sb.ID)
	if err != nil || got.Health == nil || got.Health.Reason != apitype.ReasonVMStopped {
		t.Errorf("get: %+v %v", got.Health, err)
	}
	calls := agentCalls.Load()
	_, err = alice.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", "x"}})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Type != apitype.ProblemSandboxBroken || p.Reason != apitype.ReasonVMStopped || p.Status != http.StatusConflict {
		t.Errorf("exec on a broken VM: %v", err)
	}
	if _, err := alice.ReadFile(ctx, sb.ID, "vm0", "/etc/hostname", &strings.Builder{}); !client.IsProblem(err, apitype.ProblemSandboxBroken) {
		t.Errorf("read on a broken VM: %v", err)
	}
	if n := agentCalls.Load() - calls; n != 0 {
		t.Errorf("the refusals made %d guest agent calls, want none: a broken VM is refused before its agent is asked", n)
	}
	// Resume: everything alice may see since her first event, in order.
	all := collect(t, alice, client.EventsRequest{Resume: true, LastEventID: 0}, 3, nil)
	if types(all) != "created,ready,health" {
		t.Errorf("resumed stream: %s", types(all))
	}
	if err := alice.Events(ctx, client.EventsRequest{Types: []string{"nonsense"}}, nil); !client.IsProblem(err, apitype.ProblemInvalidRequest) {
		t.Errorf("unknown type filter: %v", err)
	}
	if err := alice.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	last := collect(t, alice, client.EventsRequest{Resume: true, LastEventID: all[2].ID}, 1, nil)
	if types(last) != "deleted" {
		t.Errorf("after delete: %s", types(last))
	}
}
