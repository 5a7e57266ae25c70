package sandboxapi

import (
	"math/rand/v2"
	"testing"
)

// TestQuotaThirdOwnerFindsShare (review1's TestReviewBorrowStarvesThirdOwner):
// with the default collected bytes (256 MiB on the node, 64 MiB per
// owner), a hostile owner takes all it can (a first exec at the 64 MiB
// output cap, then default execs until refused), an honest owner takes
// its whole share in default execs, and a third and a fourth owner each
// still find their whole share. On a8ba2b8 the hostile owner held 192 MiB
// (a 128 MiB "first call" plus borrowing while a share stayed free) and
// the third owner's first default exec was refused 503.
func TestQuotaThirdOwnerFindsShare(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	q := newQuota("collected-bytes", "bytes", 256*mib, 64*mib, true, met)
	q.take("mallory", 128*mib) // one exec, output_limit 64 MiB: refused for good now
	for range 20 {
		q.take("mallory", 20*mib) // sleep 86400
	}
	for range 3 {
		if _, err := q.take("bob", 20*mib); err != nil {
			t.Fatalf("bob's default exec: %v", err)
		}
	}
	for _, owner := range []string{"carol", "dave"} {
		for i := range 3 {
			if _, err := q.take(owner, 20*mib); err != nil {
				t.Errorf("%s's default exec %d refused while fewer than four owners hold any: %v", owner, i, err)
			}
		}
		if _, err := q.take(owner, 4*mib); err != nil {
			t.Errorf("%s's last 4 MiB of its share refused: %v", owner, err)
		}
	}
}

// TestQuotaInvariant drives quotas through random sequences of owners
// arriving, taking and giving back, and checks the rule of quota.go after
// every step: while fewer than node/share owners hold some, the free part
// covers every holder's unused share plus a whole share for each owner
// that could still arrive; so a take that stays within the owner's share
// is never refused then.
func TestQuotaInvariant(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		node, share int64
		borrow      bool
	}{
		{256, 64, true}, {256, 64, false}, {100, 30, true}, {32, 8, false}, {10, 3, true}, {50, 60, true},
	} {
		for seed := range uint64(200) {
			r := rand.New(rand.NewPCG(seed, uint64(c.node)))
			q := newQuota("collected-bytes", "bytes", c.node, c.share, c.borrow, met)
			owners := []string{"a", "b", "c", "d", "e", "f"}
			var held []struct {
				owner string
				rel   func()
			}
			for step := range 200 {
				if len(held) > 0 && r.IntN(3) == 0 {
					i := r.IntN(len(held))
					held[i].rel()
					held = append(held[:i], held[i+1:]...)
					continue
				}
				owner := owners[r.IntN(len(owners))]
				n := 1 + r.Int64N(c.share+c.share/2)
				q.mu.Lock()
				before := q.byOwner[owner]
				active := int64(len(q.byOwner))
				q.mu.Unlock()
				seats := c.node / c.share
				rel, err := q.take(owner, n)
				if err != nil && before+n <= c.share && active < seats {
					t.Fatalf("%+v seed %d step %d: %s holding %d of %d refused %d with %d owners holding: %v", c, seed, step, owner, before, c.share, n, active, err)
				}
				if err == nil {
					held = append(held, struct {
						owner string
						rel   func()
					}{owner, rel})
				}
				checkQuotaInvariant(t, q)
			}
			for _, h := range held {
				h.rel()
			}
			if q.used != 0 || q.excess != 0 || len(q.byOwner) != 0 {
				t.Fatalf("%+v seed %d: all given back, used %d excess %d by %v", c, seed, q.used, q.excess, q.byOwner)
			}
		}
	}
}

// checkQuotaInvariant checks q against the rule of quota.go.
func checkQuotaInvariant(t *testing.T, q *quota) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	var used, excess, unused int64
	for _, h := range q.byOwner {
		used += h
		excess += max(0, h-q.share)
		unused += q.share - min(h, q.share)
	}
	if used != q.used || excess != q.excess || used > q.node || excess > q.spare() {
		t.Fatalf("used %d (counted %d) excess %d (counted %d, spare %d) of %d by %v", used, q.used, excess, q.excess, q.spare(), q.node, q.byOwner)
	}
	seats, active := q.node/q.share, int64(len(q.byOwner))
	if active < seats && q.node-used < unused+(seats-active)*q.share {
		t.Fatalf("%d free of %d with %d owners holding %v: less than their unused %d plus %d shares of %d", q.node-used, q.node, active, q.byOwner, unused, seats-active, q.share)
	}
}
