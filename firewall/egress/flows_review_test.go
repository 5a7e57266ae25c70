package egress

import (
	"context"
	"testing"

	"github.com/ti-mo/conntrack"
)

// TestFlowsResyncAttribution: a flow a later resync finds unfollowed is
// attributed to its address's sandbox only when it began after the
// previous table was taken, under an instance current since then: a
// flow of a deleted sandbox (not followed: past MaxLive at its start)
// still in conntrack is never put in the record of a later sandbox on
// the same address (review 14: it was).
func TestFlowsResyncAttribution(t *testing.T) {
	cases := []struct {
		name string
		// before the second resync; the first found flow 1 of sb-a
		// unfollowed (MaxLive full)
		between func(t *testing.T, b *flowBed)
		table   []ctFlow
		want    int // sb-a's and sb-c's flow records after the flows end
	}{
		{name: "deleted, another tenant's sandbox on its bridge: the old flow is not its", between: func(t *testing.T, b *flowBed) {
			if err := b.reg.Remove(context.Background(), "za"); err != nil {
				t.Fatal(err)
			}
			b.set(t, "zc", "sb-c", "vneta")
		}, table: []ctFlow{tcpOut(1, guestA)}, want: 0},
		{name: "deleted and made again: the old flow is not the new instance's", between: func(t *testing.T, b *flowBed) {
			if err := b.reg.Remove(context.Background(), "za"); err != nil {
				t.Fatal(err)
			}
			b.set(t, "za", "sb-a", "vneta")
		}, table: []ctFlow{tcpOut(1, guestA)}, want: 0},
		{name: "a flow begun since, same instance", between: func(t *testing.T, b *flowBed) {},
			table: []ctFlow{tcpOut(1, guestA), tcpOut(5, guestA)}, want: 1},
		{name: "a flow begun since, a new instance: not attributed", between: func(t *testing.T, b *flowBed) {
			if err := b.reg.Remove(context.Background(), "za"); err != nil {
				t.Fatal(err)
			}
			b.set(t, "za", "sb-a", "vneta")
		}, table: []ctFlow{tcpOut(5, guestA)}, want: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newFlowBed(t, 1)
			b.f.Handle(newEv(tcpOut(9, guestB))) // fills MaxLive
			b.log.Open("sb-a").Add(Record{Type: RecordDNS, Verdict: VerdictAnswered})
			b.f.Resync([]conntrack.Flow{*tcpOut(9, guestB).flow(), *tcpOut(1, guestA).flow()})
			if b.f.Live() != 1 {
				t.Fatalf("%d followed, want 1", b.f.Live())
			}
			b.f.Handle(destroyEv(tcpOut(9, guestB)))
			tc.between(t, b)
			var table []conntrack.Flow
			for _, c := range tc.table {
				table = append(table, *c.flow())
			}
			b.f.Resync(table)
			for _, c := range tc.table {
				b.f.Handle(destroyEv(c))
			}
			got := append(b.log.Read("sb-a", LogQuery{Type: RecordFlow}).Records, b.log.Read("sb-c", LogQuery{Type: RecordFlow}).Records...)
			if len(got) != tc.want {
				t.Errorf("sb-a's and sb-c's flows %+v, want %d", got, tc.want)
			}
		})
	}
}

// TestFlowsGoneMakeRoom: the followed flows of a deleted sandbox (still
// open in conntrack, for days when established) give their places to
// new flows once MaxLive are followed, so deleting sandboxes with open
// connections cannot leave every later flow unrecorded (review 14: they
// held them until their end).
func TestFlowsGoneMakeRoom(t *testing.T) {
	b := newFlowBed(t, 2)
	b.f.Handle(newEv(tcpOut(1, guestA)))
	b.f.Handle(newEv(tcpOut(2, guestA)))
	if err := b.reg.Remove(context.Background(), "za"); err != nil {
		t.Fatal(err)
	}
	b.f.Handle(newEv(tcpOut(3, guestB)))
	b.f.Handle(destroyEv(tcpOut(3, guestB)))
	if got := b.log.Read("sb-b", LogQuery{Type: RecordFlow}).Records; len(got) != 1 {
		t.Errorf("sb-b's flows %+v, want its one (stats %+v)", got, b.f.Stats())
	}
	if b.f.Live() != 0 {
		t.Errorf("%d flows followed, want none", b.f.Live())
	}
	// full of a live sandbox's flows: a new one is untracked, no sweep
	b.f.Handle(newEv(tcpOut(4, guestB)))
	b.f.Handle(newEv(tcpOut(5, guestB)))
	b.f.Handle(newEv(tcpOut(6, guestB)))
	if st := b.f.Stats(); st.Untracked != 1 || b.f.Live() != 2 {
		t.Errorf("stats %+v, live %d: want one untracked, two followed", st, b.f.Live())
	}
}

// TestFlowsPerOwnerShare: one sandbox holding its share of followed flows
// (PerOwner) cannot take the places of another's: the other's flows are
// followed and recorded while the first's new ones are not, and the first
// sandbox's record counts each flow it did not follow as dropped (a gap
// in its seq). A followed flow's end gives its place back, and so does a
// resync that finds it gone.
func TestFlowsPerOwnerShare(t *testing.T) {
	b := newFlowBedShare(t, 8, 2)
	for id := uint32(1); id <= 5; id++ {
		b.f.Handle(newEv(tcpOut(id, guestA)))
	}
	b.f.Handle(newEv(tcpOut(10, guestB)))
	b.f.Handle(destroyEv(tcpOut(10, guestB)))
	if got := b.log.Read("sb-b", LogQuery{Type: RecordFlow}).Records; len(got) != 1 {
		t.Errorf("sb-b's flows %+v, want its one (stats %+v)", got, b.f.Stats())
	}
	if st := b.f.Stats(); st.OverShare != 3 || st.Untracked != 0 || b.f.Live() != 2 {
		t.Errorf("stats %+v, live %d: want 3 over sb-a's share, 2 followed", st, b.f.Live())
	}
	if p := b.log.Read("sb-a", LogQuery{}); p.Dropped != 3 || len(p.Records) != 0 {
		t.Errorf("sb-a's record %+v: want 3 dropped, no record yet", p)
	}
	// an end gives the place back: the next flow of sb-a is followed
	b.f.Handle(destroyEv(tcpOut(1, guestA)))
	b.f.Handle(newEv(tcpOut(6, guestA)))
	b.f.Handle(destroyEv(tcpOut(6, guestA)))
	if got := b.log.Read("sb-a", LogQuery{Type: RecordFlow}).Records; len(got) != 2 || got[0].Seq != 4 {
		t.Errorf("sb-a's flows %+v, want 1 and 6, numbered after the 3 dropped", got)
	}
	// a resync that finds flow 2 gone gives its place back too
	b.f.Resync([]conntrack.Flow{*tcpOut(7, guestB).flow()})
	b.f.Handle(newEv(tcpOut(8, guestA)))
	b.f.Handle(newEv(tcpOut(9, guestA)))
	if st := b.f.Stats(); st.OverShare != 3 || b.f.Live() != 3 {
		t.Errorf("after the resync: stats %+v, live %d: want 3 over share, 3 followed (7, 8, 9)", st, b.f.Live())
	}
}
