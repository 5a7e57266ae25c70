package sandboxapi

import "testing"

// TestReviewBorrowStarvesThirdOwner (review1): with the default collected
// bytes (256 MiB on the node, 64 MiB per owner, borrowing on), one hostile
// owner takes 192 MiB: one first call of 2 x 64 MiB (the "first call's
// worth" exemption lets it be twice the share) plus 64 MiB borrowed
// (a share stays free). One honest owner then runs three default execs
// (3 x 2 x 10 MiB) and a third owner's first default exec is refused 503:
// one attacker plus one ordinary tenant leave the node with nothing for
// anyone else (for up to a day: exec timeouts go to 24 h). The package
// doc promises a fifth owner is refused only while four are at their
// full share.
func TestReviewBorrowStarvesThirdOwner(t *testing.T) {
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	q := newQuota("collected-bytes", "bytes", 256*mib, 64*mib, true, met)
	mustTake := func(owner string, n int64) {
		t.Helper()
		if _, err := q.take(owner, n); err != nil {
			t.Fatalf("%s takes %d MiB: %v", owner, n/mib, err)
		}
	}
	mustTake("mallory", 128*mib) // one exec, output_limit 64 MiB, sleep 86400
	mustTake("mallory", 20*mib)  // borrowing: a share stays free
	mustTake("mallory", 20*mib)
	mustTake("mallory", 20*mib)
	mustTake("bob", 20*mib) // bob's ordinary execs, within his share
	mustTake("bob", 20*mib)
	mustTake("bob", 20*mib)
	if _, err := q.take("carol", 20*mib); err != nil {
		t.Errorf("carol's first default exec (20 MiB) refused while only mallory and bob are active: %v", err)
	}
}
