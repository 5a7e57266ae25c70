package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// logEgress is fakeEgress keeping a real egress record (egress.Log) as
// the daemon's Egress does: Remove forgets the sandbox's ring, TakeLog
// takes it (counted in takes).
type logEgress struct {
	*fakeEgress
	log   *egress.Log
	mu    sync.Mutex
	takes int
}

func (l *logEgress) Remove(ctx context.Context, sb, zone string) error {
	l.log.Forget(sb)
	return l.fakeEgress.Remove(ctx, sb, zone)
}

func (l *logEgress) Log(sb string, f sandbox.EgressLogFilter) apitype.EgressLog {
	p := l.log.Read(sb, egress.LogQuery{Type: f.Type, VMID: f.VMID, Since: f.Since, Limit: f.Limit})
	out := apitype.EgressLog{Sandbox: sb, Dropped: p.Dropped, Next: p.Next, More: p.More}
	for _, r := range p.Records {
		out.Records = append(out.Records, apiRecord(r))
	}
	return out
}

func (l *logEgress) TakeLog(sb string) sandbox.EgressHandover {
	l.mu.Lock()
	l.takes++
	l.mu.Unlock()
	return takenRecord{l.log.Take(sb)}
}

func (l *logEgress) taken() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takes
}

// apiRecord is the part of r this test reads, as the API shows it.
func apiRecord(r egress.Record) apitype.EgressRecord {
	return apitype.EgressRecord{Seq: r.Seq, Type: r.Type, VMID: r.Guest.VMID, Name: r.Name, Verdict: r.Verdict}
}

type takenRecord struct{ t *egress.Taken }

func (r takenRecord) Len() int { return r.t.Len() }
func (r takenRecord) Dropped() uint64 {
	if r.t == nil {
		return 0
	}
	return r.t.Dropped
}
func (r takenRecord) Next() uint64 { return r.t.Last() }
func (r takenRecord) Each(fn func(apitype.EgressRecord) error) error {
	return r.t.Each(func(rec egress.Record) error { return fn(apiRecord(rec)) })
}
func (r takenRecord) Release() { r.t.Release() }

// recordingTeardown is the fake Proxmox whose guests keep reaching out
// while their sandbox is torn down: each stop and delete of one of sb's
// VMs adds a record to sb's egress record (a connection ending as its VM
// goes, a conntrack flow's end).
type recordingTeardown struct {
	*apitest.Proxmox
	log *egress.Log
	mu  sync.Mutex
	sb  string
}

func (p *recordingTeardown) during(sb string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sb = sb
}

func (p *recordingTeardown) record(vmid int, name string) {
	p.mu.Lock()
	sb := p.sb
	p.mu.Unlock()
	if sb != "" {
		p.log.Open(sb).Add(egress.Record{Type: egress.RecordConn, Verdict: egress.VerdictAllowed, Name: name, Guest: egress.Guest{VMID: vmid}})
	}
}

func (p *recordingTeardown) StopVM(ctx context.Context, id int) error {
	p.record(id, "stop.example")
	return p.Proxmox.StopVM(ctx, id)
}

func (p *recordingTeardown) DeleteVM(ctx context.Context, id int) error {
	p.record(id, "delete.example")
	return p.Proxmox.DeleteVM(ctx, id)
}

// TestDeleteKeepingEgress: a delete that keeps the egress record hands
// over every record of the sandbox, those its guests made while its VMs
// were torn down included, oldest first and its VM named; the ring has
// left the node's record (no read, no counts, a late record of the old
// instance goes nowhere) while its records count in the node's bound
// until the handover is released (Log.Held drops then). A plain delete
// and the reaper's keep nothing (the ring forgotten at once); a sandbox
// already gone is ErrUnknown; a node whose egress part hands nothing over
// is ErrNotConfigured and deletes nothing.
func TestDeleteKeepingEgress(t *testing.T) {
	cases := []struct {
		name string
		// how: "keep" (DeleteKeepingEgress), "plain" (Delete), "reap" (it
		// expires and the reaper deletes it), "gone" (deleted, then
		// DeleteKeepingEgress), "unconfigured" (DeleteKeepingEgress on a
		// node whose egress part keeps no record)
		how     string
		wantErr error
		takes   int
		deleted bool
	}{
		{name: "kept", how: "keep", takes: 1, deleted: true},
		{name: "plain delete keeps nothing", how: "plain", deleted: true},
		{name: "reaper keeps nothing", how: "reap", deleted: true},
		{name: "sandbox gone", how: "gone", wantErr: sandbox.ErrUnknown, deleted: true},
		{name: "node hands nothing over", how: "unconfigured", wantErr: sandbox.ErrNotConfigured},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			log := egress.NewLog(egress.LogConfig{PerOwner: 16, Node: 64})
			eg := &logEgress{fakeEgress: &fakeEgress{policy: map[string]apitype.EgressPolicy{}}, log: log}
			g := apitest.NewGuests()
			px := &recordingTeardown{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), log: log}
			clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			e := newEngine(t, func(o *sandbox.Options) {
				o.Proxmox, o.Guests, o.Egress, o.Now = px, g.Dial, eg, clk.now
				if tc.how == "unconfigured" {
					o.Egress = eg.fakeEgress
				}
			})
			mk := func() apitype.Sandbox {
				req := oneVM("debian")
				req.VMs = append(req.VMs, apitype.VMRequest{Name: "vm1", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"net0"}})
				sb, err := e.Create(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				return sb
			}
			sb, other := mk(), mk()
			log.Open(other.ID).Add(egress.Record{Type: egress.RecordDNS, Verdict: egress.VerdictAnswered, Name: "other.example"})
			ring := log.Open(sb.ID)
			ring.Add(egress.Record{Type: egress.RecordDNS, Verdict: egress.VerdictAnswered, Name: "before.example", Guest: egress.Guest{VMID: sb.VMs[0].VMID}})
			px.during(sb.ID)

			var got sandbox.EgressHandover
			var err error
			switch tc.how {
			case "keep", "unconfigured":
				got, err = e.DeleteKeepingEgress(ctx, sb.ID, "test")
			case "plain":
				err = e.Delete(ctx, sb.ID)
			case "reap":
				clk.add(2 * time.Minute)
				if _, err := e.Extend(other.ID, time.Hour); err != nil {
					t.Fatal(err)
				}
				if n := e.Reap(ctx); n != 1 {
					t.Errorf("reaped %d, want 1", n)
				}
			case "gone":
				if err := e.Delete(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
				got, err = e.DeleteKeepingEgress(ctx, sb.ID, "test")
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if _, ok := e.Get(sb.ID); ok == tc.deleted {
				t.Errorf("sandbox there %v, want deleted %v", ok, tc.deleted)
			}
			if n := eg.taken(); n != tc.takes {
				t.Errorf("%d records taken, want %d", n, tc.takes)
			}
			ring.Add(egress.Record{Type: egress.RecordConn, Name: "late.example"}) // the old instance's late record
			if tc.how == "unconfigured" {
				if p := log.Read(sb.ID, egress.LogQuery{}); len(p.Records) != 2 {
					t.Errorf("the record of a sandbox not deleted: %+v", p.Records)
				}
				return
			}
			if p := log.Read(sb.ID, egress.LogQuery{}); len(p.Records) != 0 {
				t.Errorf("the record still in the node's after the delete: %+v", p.Records)
			}
			if _, ok := log.Counts(sb.ID); ok {
				t.Error("the record's counts still in the node's after the delete")
			}
			if got == nil {
				if n := log.Held(); n != 1 {
					t.Errorf("held %d after a delete keeping nothing, want 1 (the other sandbox's)", n)
				}
				return
			}
			var names, vms []string
			var seqs []uint64
			if err := got.Each(func(r apitype.EgressRecord) error {
				names, vms, seqs = append(names, r.Name), append(vms, r.VM), append(seqs, r.Seq)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// each VM is stopped then deleted, the two VMs at once
			slices.Sort(names[1:])
			if !slices.Equal(names, []string{"before.example", "delete.example", "delete.example", "stop.example", "stop.example"}) ||
				!slices.Equal(seqs, []uint64{1, 2, 3, 4, 5}) || got.Next() != 5 || got.Len() != 5 || got.Dropped() != 0 {
				t.Errorf("handed over %v seqs %v (next %d, len %d, dropped %d), want the record before the delete and the four made during its teardown",
					names, seqs, got.Next(), got.Len(), got.Dropped())
			}
			if vms[0] != "vm0" || slices.Contains(vms, "") {
				t.Errorf("VMs %v: not named", vms)
			}
			if n := log.Held(); n != 6 {
				t.Errorf("held %d before the release, want 6 (the 5 handed over count until then)", n)
			}
			got.Release()
			if n := log.Held(); n != 1 {
				t.Errorf("held %d after the release, want 1 (the other sandbox's)", n)
			}
		})
	}
}

// takingClaimEgress is recordingEgress (whose Claim can be held) that
// hands a deleted sandbox's record over (sandbox.EgressTaker), counting
// the takes.
type takingClaimEgress struct {
	*recordingEgress
	takes int // guarded by recordingEgress.mu
}

func (t *takingClaimEgress) TakeLog(sb string) sandbox.EgressHandover {
	t.mu.Lock()
	t.takes++
	t.mu.Unlock()
	return takenRecord{}
}

// TestDeleteKeepingEgressOfACreate: a delete keeping the egress record of
// a sandbox being created (here a pool member being claimed: the
// claimer's, its policy not in force yet) is refused, a conflict, and
// deletes nothing: its record reads empty until it is ready, so there is
// nothing of it to hand over yet. Before, it cancelled the create (the
// claim failed, the member was torn down and the claimer's create ran
// cold, on another id) and answered that the sandbox was gone, its record
// gone with "that" delete: a not-found that had deleted it.
func TestDeleteKeepingEgressOfACreate(t *testing.T) {
	ctx := context.Background()
	eg := &takingClaimEgress{recordingEgress: &recordingEgress{fakeEgress: fakeEgress{policy: map[string]apitype.EgressPolicy{}},
		denials: map[string][]apitype.EgressDenial{}, entered: make(chan struct{}), hold: make(chan struct{})}}
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) { o.Egress = eg })
	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 1 {
		t.Fatalf("%d members, want 1", len(members))
	}
	id := members[0].ID
	req := oneVMSized("debian", 1, 512)
	req.Owner = "bob"
	created := make(chan apitype.Sandbox, 1)
	go func() {
		sb, err := b.e.Create(ctx, req)
		if err != nil {
			t.Error(err)
		}
		created <- sb
	}()
	<-eg.entered
	deleted := make(chan error, 1)
	go func() {
		h, err := b.e.DeleteKeepingEgress(ctx, id, "bob")
		if h != nil {
			h.Release()
		}
		deleted <- err
	}()
	var err error
	select {
	case err = <-deleted:
		close(eg.hold)
	case <-time.After(10 * time.Second): // it waits for the create it cancelled
		close(eg.hold)
		err = <-deleted
	}
	sb := <-created
	if !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("a keeping delete of a sandbox being created: %v, want a conflict", err)
	}
	if sb.ID != id || !sb.FromPool {
		t.Errorf("the claimer's create gave %s (from the pool %v), want the member %s claimed", sb.ID, sb.FromPool, id)
	}
	if got, ok := b.e.Get(id); !ok || got.State != apitype.StateReady {
		t.Errorf("after the refused delete: %+v %v, want it ready", got, ok)
	}
	eg.mu.Lock()
	defer eg.mu.Unlock()
	if eg.takes != 0 {
		t.Errorf("%d records taken, want none", eg.takes)
	}
}
