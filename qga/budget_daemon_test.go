package qga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestOneOwnersGuestsLeaveOthersAShare: the daemon's own calls into a
// guest (the health loop's guest-ping and guest-get-fsinfo, pool pings)
// are held to a share like any owner's calls, whether they carry the
// owner of the VM they target (sandbox.WithOwner, as the engine marks
// them) or no owner at all (then they share one share together). A
// hostile guest answers guest-ping with a line as long as MaxReplyBytes
// and then stalls (guest-get-fsinfo replies are bounded far lower,
// TestFSInfoReplyBounded): six such VMs of one owner, with a budget of
// six reply buffers, hold no more than all but one share of it, and
// another owner's ping is served from the share left.
func TestOneOwnersGuestsLeaveOthersAShare(t *testing.T) {
	for _, c := range []struct {
		name  string
		owner func(context.Context) context.Context
	}{
		{"no owner", func(ctx context.Context) context.Context { return ctx }},
		{"the VMs' owner", func(ctx context.Context) context.Context { return sandbox.WithOwner(ctx, "mallory") }},
	} {
		t.Run(c.name, func(t *testing.T) { oneOwnersGuests(t, c.owner) })
	}
}

func oneOwnersGuests(t *testing.T, mark func(context.Context) context.Context) {
	const hostile = 6
	// the budget holds exactly six reply buffers of the default bound
	perVM := int64(New(Options{}).Options().MaxReplyBytes + readSize)
	b := NewBudget(hostile*perVM, 0)
	// the hostile calls hold (stall) until end(), long past bob's ping
	// even on a loaded machine; a bob waiting on them would time out
	opts := Options{Budget: b, StallTimeout: 2 * time.Minute, CallTimeout: 2 * time.Minute, DrainTimeout: 100 * time.Millisecond}
	c := New(opts)
	junk := bytes.Repeat([]byte("x"), c.Options().MaxReplyBytes-64)
	stop := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(stop) }) }
	var agents []*fakeAgent
	for range hostile {
		f := newFakeAgent(t)
		f.setHandler(func(conn net.Conn, cmd string, id, _ json.RawMessage) bool {
			if cmd != "guest-ping" {
				return okHandler(conn, cmd, id, nil)
			}
			conn.Write([]byte(`{"return": {"x": "`))
			conn.Write(junk) // no end of line: the client keeps growing its buffer
			<-stop
			return false
		})
		agents = append(agents, f)
	}
	t.Cleanup(end)            // runs before the fake agents' cleanups, which wait for their handlers
	benign := newFakeAgent(t) // bob's guest: answers everything at once
	var wg sync.WaitGroup
	var returned atomic.Int64
	for _, f := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// like sandbox.checkVM (its PingTimeout is 3s; longer here, so
			// that a loaded machine still has them hold while bob pings)
			ctx, cancel := context.WithTimeout(mark(context.Background()), 2*time.Minute)
			defer cancel()
			defer returned.Add(1)
			ferr := c.Agent(f.Socket).Ping(ctx)
			t.Logf("hostile ping: %v (peak %d)", ferr, b.Peak())
		}()
	}
	// wait until the hostile buffers grew as far as the budget lets them
	// (used stays the same for 300ms), or their calls were all refused
	deadline := time.Now().Add(time.Minute)
	used, since := b.Used(), time.Now()
	for time.Now().Before(deadline) && returned.Load() < hostile && (used == 0 || time.Since(since) < 300*time.Millisecond) {
		time.Sleep(5 * time.Millisecond)
		if u := b.Used(); u != used {
			used, since = u, time.Now()
		}
	}
	if p := b.Peak(); p < int64(c.Options().MaxReplyBytes) {
		t.Fatalf("the hostile guests took at most %d bytes of the budget, not even one reply: the test shows nothing", p)
	}
	ctx, cancel := context.WithTimeout(sandbox.WithOwner(context.Background(), "bob"), time.Minute)
	err := c.Agent(benign.Socket).Ping(ctx)
	cancel()
	end()
	wg.Wait()
	peak := b.Peak()
	t.Logf("budget used by the health calls of one owner's guests: %d (peak %d) of %d (share %d)", used, peak, b.Max(), b.Share())
	if peak > b.Max()-b.Share() {
		t.Errorf("calls for one owner's guests held %d bytes of the budget, more than all but one share (%d): no owner's share bounds them", peak, b.Max()-b.Share())
	}
	if err != nil {
		t.Errorf("bob's ping while another owner's guests answer the health loop: %v, want it served from bob's share", err)
	}
}

// TestFSInfoReplyBounded: the health monitor's guest-get-fsinfo, asked of
// every VM every round, reads a reply line of at most maxFSInfoReply
// bytes (not MaxReplyBytes, sized for file reads): a guest answering with
// a longer line is refused KindTooLarge with no more than that bound of
// the budget taken. An ordinary answer is decoded, and the copies decoded
// from it are charged to the budget while they live.
func TestFSInfoReplyBounded(t *testing.T) {
	var entries []string
	for i := range maxFilesystems {
		entries = append(entries, fmt.Sprintf(`{"name": "%s", "mountpoint": "/m%d", "type": "ext4", "used-bytes": 1, "total-bytes": 2, "disk": []}`, strings.Repeat("n", maxFSString), i))
	}
	good := `[` + strings.Join(entries, ", ") + `]`
	long := bytes.Repeat([]byte("x"), 4*maxFSInfoReply)
	for _, tc := range []struct {
		name     string
		answer   func(conn net.Conn, id json.RawMessage)
		tooLarge bool
		minPeak  int64
	}{
		{"long line", func(conn net.Conn, _ json.RawMessage) {
			conn.Write([]byte(`{"return": [{"name": "`))
			conn.Write(long)
		}, true, 0},
		{"ordinary", func(conn net.Conn, id json.RawMessage) {
			reply(conn, `{"return": `+good+`, "id": `+string(id)+"}\n")
		}, false, 3 * int64(len(good))}, // the line, its copy, the decoded strings
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAgent(t)
			f.setHandler(func(conn net.Conn, cmd string, id, _ json.RawMessage) bool {
				if cmd != "guest-get-fsinfo" {
					return okHandler(conn, cmd, id, nil)
				}
				tc.answer(conn, id)
				return !tc.tooLarge
			})
			b := NewBudget(0, 0)
			c := New(Options{Budget: b, StallTimeout: 5 * time.Second, CallTimeout: 5 * time.Second, DrainTimeout: 100 * time.Millisecond})
			fs, err := c.Agent(f.Socket).Filesystems(context.Background())
			var pe *ProtocolError
			if tc.tooLarge {
				if !errors.As(err, &pe) || pe.Kind != KindTooLarge {
					t.Fatalf("a line longer than %d bytes: %v, want %s", maxFSInfoReply, err, KindTooLarge)
				}
			} else if err != nil || len(fs) != maxFilesystems {
				t.Fatalf("ordinary answer: %d filesystems, %v", len(fs), err)
			}
			if p := b.Peak(); p > maxFSInfoReply+3*readSize+tc.minPeak || p < tc.minPeak {
				t.Errorf("budget peak %d, want between %d and the bound %d", p, tc.minPeak, maxFSInfoReply+3*readSize+tc.minPeak)
			}
			if u := b.Used(); u != 0 {
				t.Errorf("%d bytes of the budget still taken", u)
			}
		})
	}
}
