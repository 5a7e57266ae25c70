package qga

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestReviewUnownedCallsTakeOtherOwnersShare (review1): the daemon's own
// calls into a guest carry no owner (the health loop's guest-ping and
// guest-get-fsinfo every 5 s for every VM, pool pings, the containment
// check's probes and its exec in every other sandbox's guest), so the
// budget charges them to the total only. A hostile guest answers
// guest-get-fsinfo with a line as long as MaxReplyBytes (~11 MB by
// default) and then stalls until the health's PingTimeout: each of an
// owner's VMs pins a reply buffer of MaxReplyBytes+64 KiB, outside that
// owner's share. Enough VMs of one owner (23 at the defaults: 256 MiB /
// 11.25 MB; no per-owner sandbox or VM cap exists) fill the node's
// budget in every health round, and another owner's ordinary call is then
// refused ErrBudget (503). Scaled down here: a budget of six reply buffers (share:
// a quarter), six hostile VMs.
func TestReviewUnownedCallsTakeOtherOwnersShare(t *testing.T) {
	const hostile = 6
	// the budget holds exactly six reply buffers of the default bound
	perVM := int64(New(Options{}).Options().MaxReplyBytes + readSize)
	b := NewBudget(hostile*perVM, 0)
	opts := Options{Budget: b, StallTimeout: 10 * time.Second, CallTimeout: 10 * time.Second, DrainTimeout: 100 * time.Millisecond}
	c := New(opts)
	junk := bytes.Repeat([]byte("x"), c.Options().MaxReplyBytes-64)
	stop := make(chan struct{})
	var agents []*fakeAgent
	for range hostile {
		f := newFakeAgent(t)
		f.setHandler(func(conn net.Conn, cmd string, id, _ json.RawMessage) bool {
			if cmd != "guest-get-fsinfo" {
				return okHandler(conn, cmd, id, nil)
			}
			conn.Write([]byte(`{"return": [{"name": "`))
			conn.Write(junk) // no end of line: the client keeps growing its buffer
			<-stop
			return false
		})
		agents = append(agents, f)
	}
	benign := newFakeAgent(t) // bob's guest: answers everything at once
	var wg sync.WaitGroup
	for _, f := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// like sandbox.checkVM: no owner on the context, PingTimeout 3s
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, ferr := c.Agent(f.Socket).Filesystems(ctx)
			t.Logf("hostile fsinfo: %v (peak %d)", ferr, b.Peak())
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	for b.Used() < int64(hostile)*int64(c.Options().MaxReplyBytes) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	used := b.Used()
	ctx, cancel := context.WithTimeout(sandbox.WithOwner(context.Background(), "bob"), 2*time.Second)
	err := c.Agent(benign.Socket).Ping(ctx)
	cancel()
	close(stop)
	wg.Wait()
	t.Logf("budget used by the unowned health calls of one owner's guests: %d of %d (share %d)", used, b.Max(), b.Share())
	if used > b.Max()-b.Share() {
		t.Errorf("calls for one owner's guests hold %d bytes of the budget, more than all but one share (%d): no owner's share bounds them", used, b.Max()-b.Share())
	}
	if err != nil {
		t.Errorf("bob's ping while another owner's guests answer the health loop: %v, want it served from bob's share", err)
	}
}
