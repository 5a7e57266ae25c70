package sandbox

import (
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// OnPublish sets a hook every publish calls before it takes the bus's
// lock; set it before the engine is used.
func (m *Engine) OnPublish(f func()) { m.events.hooks.publish = f }

// OnFilter sets a hook EventsSince calls for each event it filters; set
// it before the engine is used.
func (m *Engine) OnFilter(f func()) { m.events.hooks.filter = f }

// EngineLockFree reports whether Engine.mu can be taken within d: false
// when it stays held that long (by the caller of a hook, for one).
func (m *Engine) EngineLockFree(d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(time.Millisecond) {
		if m.mu.TryLock() {
			m.mu.Unlock()
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// Publish publishes e as the engine's own events are (emit).
func (m *Engine) Publish(e apitype.Event) { m.emit(e) }
