package egress

import "sync"

// quota bounds what one owner (a sandbox, or the node default) holds at
// once of a shared resource (queries in flight, connections), so that one
// guest cannot starve the others of a node-wide limit.
type quota struct {
	max int

	mu   sync.Mutex // guards held
	held map[string]int
}

func newQuota(max int) *quota { return &quota{max: max, held: map[string]int{}} }

// take reserves one unit for owner; false when owner holds max already.
func (q *quota) take(owner string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held[owner] >= q.max {
		return false
	}
	q.held[owner]++
	return true
}

// give returns a unit take reserved.
func (q *quota) give(owner string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held[owner]--; q.held[owner] <= 0 {
		delete(q.held, owner)
	}
}
