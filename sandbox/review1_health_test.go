package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// busyPingGuest fails its ping with the daemon's own "node busy" refusal
// while busy is set: what qga's Ping returns (mapErr: ErrBudget ->
// sandbox.ErrBusy) while the node-wide buffer budget is held by other
// owners' guests (TestReviewUnownedCallsTakeOtherOwnersShare in qga).
type busyPingGuest struct {
	sandbox.Guest
	busy *atomic.Bool
}

func (g busyPingGuest) Ping(ctx context.Context) error {
	if g.busy.Load() {
		return fmt.Errorf("%w: qga 100.qga guest-sync-delimited: node-wide budget of buffered guest bytes exhausted", sandbox.ErrBusy)
	}
	return g.Guest.Ping(ctx)
}

// TestReviewBusyNodeBreaksOtherOwnersSandboxes (review1): the health loop
// counts a ping the daemon itself refused (sandbox.ErrBusy: the node-wide
// qga budget is full, which one owner's hostile guests can arrange, see
// qga TestReviewUnownedCallsTakeOtherOwnersShare) as the agent not
// answering. After AgentBrokenAfter (20 s) bob's healthy sandbox is
// broken (agent-unresponsive), and every exec and file call to it is
// refused with sandbox-broken: one tenant's guests take another tenant's
// sandboxes out of service. Want: a refusal of the daemon's own budget is
// not a verdict on the guest (skip the round, or charge health pings to a
// reserve no owner can take).
func TestReviewBusyNodeBreaksOtherOwnersSandboxes(t *testing.T) {
	var busy atomic.Bool
	g := apitest.NewGuests()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	node := &nodeStats{st: map[int]sandbox.VMStats{}}
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	e := newEngine(t, func(o *sandbox.Options) {
		o.Proxmox = px
		o.Guests = func(s string) sandbox.Guest { return busyPingGuest{Guest: g.Dial(s), busy: &busy} }
		o.Now = clk.now
		o.Registerer = prometheus.NewRegistry()
		o.Health = sandbox.HealthOptions{Node: node, AgentBrokenAfter: 20 * time.Second, OOMWindow: time.Minute, ExpiringSoon: time.Minute}
	})
	req := oneVM("debian")
	req.Owner = "bob"
	req.TTLSeconds = 600
	sb, err := e.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	e.CheckHealth(context.Background())
	busy.Store(true) // mallory's guests hold the node's buffer budget
	for range 6 {
		clk.add(5 * time.Second)
		e.CheckHealth(context.Background())
	}
	h, _ := e.Health(sb.ID)
	berr := e.Broken(sb.ID, "")
	t.Logf("bob's sandbox after 30 s of a busy node: %s (%s); guest calls: %v", h.State, h.Reason, berr)
	if h.State == apitype.HealthBroken || berr != nil {
		var be *sandbox.BrokenError
		t.Errorf("bob's healthy sandbox turned %s/%s because the daemon's own budget was full (broken error: %v)", h.State, h.Reason, errors.As(berr, &be))
	}
}
