package egress

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ti-mo/conntrack"
)

// TestFlowsEndOf: a flow is recorded only at its end, so the flows of a
// sandbox still in conntrack when its record is handed over at its
// delete (a TCP flow in its TIME_WAIT; one its guest kept open, days)
// were recorded nowhere: a guest kept what it sent out of the record by
// not closing its connection (review16). EndOf deletes the conntrack
// entries of the owner's followed flows and waits for their DESTROY
// events, which record them in its ring with conntrack's counts, before
// the ring is taken; another sandbox's flows are left alone; events that
// never come (an overrun) end the wait at its context, its waiter gone.
func TestFlowsEndOf(t *testing.T) {
	cases := []struct {
		name string
		// deliver: the killed flows' DESTROY events come (Run's goroutine)
		deliver bool
		owner   string
		wantN   int // flows killed
		wantErr bool
		// records of sb-a's ring taken, flows still followed after
		records, live int
	}{
		{name: "sb-a's open flows recorded before the take", deliver: true, owner: "sb-a", wantN: 2, records: 2, live: 1},
		{name: "an owner with no flow followed", deliver: true, owner: "sb-c", wantN: 0, records: 0, live: 3},
		{name: "their ends never seen", deliver: false, owner: "sb-a", wantN: 2, wantErr: true, records: 0, live: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newFlowBed(t, 16)
			open := map[uint32]ctFlow{1: tcpOut(1, guestA), 2: tcpOut(2, guestA2), 3: tcpOut(3, guestB)}
			for _, id := range []uint32{1, 2, 3} {
				b.f.Handle(newEv(open[id]))
			}
			b.log.Open("sb-c") // a ring with no flow
			var mu sync.Mutex
			var killed []uint32
			var wg sync.WaitGroup
			b.f.kill = func(fls []conntrack.Flow) (int, error) {
				for _, fl := range fls {
					mu.Lock()
					killed = append(killed, fl.ID)
					mu.Unlock()
					c := open[fl.ID]
					if fl.TupleOrig.IP.SourceAddress != c.src || fl.TupleOrig.Proto.SourcePort != c.sport || fl.TupleOrig.Proto.DestinationPort != c.dport {
						t.Errorf("killed %+v, not flow %d's tuple", fl.TupleOrig, fl.ID)
					}
					if tc.deliver {
						wg.Add(1)
						go func() { // later, as Run reads them
							defer wg.Done()
							time.Sleep(10 * time.Millisecond)
							b.f.Handle(destroyEv(c))
						}()
					}
				}
				return len(fls), nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if !tc.deliver {
				ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
			}
			defer cancel()
			err := b.f.EndOf(ctx, tc.owner)
			h := b.log.Take("sb-a") // as soon as EndOf returns
			defer h.Release()
			wg.Wait()
			if (err != nil) != tc.wantErr {
				t.Errorf("EndOf: %v, want an error %v", err, tc.wantErr)
			}
			slices.Sort(killed)
			if want := map[int][]uint32{0: nil, 2: {1, 2}}[tc.wantN]; !slices.Equal(killed, want) {
				t.Errorf("killed %v, want %v (never another sandbox's)", killed, want)
			}
			var got []Record
			_ = h.Each(func(r Record) error { got = append(got, r); return nil })
			if len(got) != tc.records {
				t.Errorf("sb-a handed over %d records, want %d: %+v", len(got), tc.records, got)
			}
			for _, r := range got {
				if r.Type != RecordFlow || r.BytesOut != 100640 || r.BytesIn != 2500 {
					t.Errorf("record %+v: not the flow with conntrack's counts", r)
				}
			}
			if b.f.Live() != tc.live {
				t.Errorf("%d flows followed, want %d", b.f.Live(), tc.live)
			}
			b.f.mu.Lock()
			defer b.f.mu.Unlock()
			if len(b.f.ended) != 0 {
				t.Errorf("waiters left: %v", b.f.ended)
			}
		})
	}
}
