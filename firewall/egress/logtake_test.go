package egress

import (
	"errors"
	"slices"
	"testing"
)

// TestLogTake: Take hands an owner's whole ring over, oldest first (a
// ring that turned over too), with its dropped count; the ring leaves the
// Log at once (no read, no counts, a late record of the old instance is
// not taken, a new instance starts empty) while its records stay counted
// in the node's bound until Release, after which the bound is free again
// and Each holds nothing; an owner with no ring hands over nothing.
func TestLogTake(t *testing.T) {
	cases := []struct {
		name    string
		cfg     LogConfig
		adds    int // records of "sb", after one of "other"
		want    []uint64
		dropped uint64
	}{
		{name: "ring not full", cfg: LogConfig{PerOwner: 8, Node: 16}, adds: 3, want: []uint64{1, 2, 3}},
		{name: "ring turned over", cfg: LogConfig{PerOwner: 3, Node: 16}, adds: 5, want: []uint64{3, 4, 5}, dropped: 2},
		{name: "node bound reached", cfg: LogConfig{PerOwner: 8, Node: 3}, adds: 4, want: []uint64{1, 2}, dropped: 2},
		{name: "no ring", cfg: LogConfig{PerOwner: 8, Node: 16}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLog(tc.cfg)
			l.Open("other").Add(Record{Type: RecordDNS})
			var r *Ring
			if tc.adds > 0 {
				r = l.Open("sb")
			}
			for range tc.adds {
				r.Add(Record{Type: RecordConn, Name: "sb.example"})
			}
			heldBefore := l.Held()
			got := l.Take("sb")
			if tc.adds == 0 && got != nil {
				t.Fatalf("an owner without a ring handed over %+v", got)
			}
			r.Add(Record{Type: RecordConn, Name: "late.example"}) // the old instance's late record
			var seen []uint64
			if err := got.Each(func(rec Record) error { seen = append(seen, rec.Seq); return nil }); err != nil {
				t.Fatal(err)
			}
			var last uint64
			if len(tc.want) > 0 {
				last = tc.want[len(tc.want)-1]
			}
			if !slices.Equal(seen, tc.want) || got.Len() != len(tc.want) || got.Last() != last || (got != nil && got.Dropped != tc.dropped) {
				t.Errorf("handed over %v (len %d, last %d), want %v, dropped %d", seen, got.Len(), got.Last(), tc.want, tc.dropped)
			}
			if p := l.Read("sb", LogQuery{}); len(p.Records) != 0 {
				t.Errorf("read after Take: %+v", p)
			}
			if _, ok := l.Counts("sb"); ok {
				t.Error("counts after Take")
			}
			if n := l.Held(); n != heldBefore {
				t.Errorf("held %d before Release, want %d (the handed-over records still count)", n, heldBefore)
			}
			got.Release()
			got.Release()
			if n := l.Held(); n != 1 {
				t.Errorf("held %d after Release, want 1 (the other owner's)", n)
			}
			if got.Len() != 0 {
				t.Errorf("%d records after Release", got.Len())
			}
			l.Open("sb").Add(Record{Type: RecordDNS, Name: "new.example"})
			if p := l.Read("sb", LogQuery{}); len(p.Records) != 1 || p.Records[0].Seq != 1 {
				t.Errorf("the new instance: %+v", p.Records)
			}
		})
	}
}

// TestLogTakeEachStops: Each stops at fn's first error and returns it.
func TestLogTakeEachStops(t *testing.T) {
	l := NewLog(LogConfig{PerOwner: 8})
	r := l.Open("sb")
	for range 4 {
		r.Add(Record{Type: RecordDNS})
	}
	got := l.Take("sb")
	defer got.Release()
	stop := errors.New("client gone")
	n := 0
	err := got.Each(func(Record) error {
		if n++; n == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 2 {
		t.Errorf("Each: %v after %d records, want the error after 2", err, n)
	}
}
