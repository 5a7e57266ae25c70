package apitype

import "time"

// Event types of GET /v1/events.
const (
	// EventCreated: a create began (the sandbox exists, state creating).
	EventCreated = "created"
	// EventReady: every VM answered its agent; the sandbox is ready.
	EventReady = "ready"
	// EventHealth: the sandbox's health state or reason changed (Health).
	EventHealth = "health"
	// EventEgressDenied: the host guard refused a name or connection of
	// the sandbox (Denial).
	EventEgressDenied = "egress-denied"
	// EventEgress: what the sandbox's egress record counted since the
	// last egress event of it (Egress); at most one per sandbox per
	// second, only when something was recorded.
	EventEgress = "egress"
	// EventExpiringSoon: the sandbox expires within the warning window
	// (ExpiresAt); sent once per expiry.
	EventExpiringSoon = "expiring-soon"
	// EventExpired: the reaper is deleting the sandbox for its TTL.
	EventExpired = "expired"
	// EventDeleted: the sandbox is gone.
	EventDeleted = "deleted"
	// EventGap: the stream could not resume from Last-Event-ID: events
	// after it left the daemon's bounded buffer (or the daemon restarted);
	// the caller should re-read the sandboxes it follows.
	EventGap = "gap"
	// EventTemplateBuildProgress: a step of a template build said a line
	// (Template, Detail). Template events belong to no owner: streams of
	// owner-bound tokens never carry them.
	EventTemplateBuildProgress = "template.build.progress"
	// EventTemplateBuildDone: a template build ended with the template
	// (Template, VMID; Detail says whether it was reused).
	EventTemplateBuildDone = "template.build.done"
	// EventTemplateBuildFailed: a template build failed (Template, Detail
	// the error).
	EventTemplateBuildFailed = "template.build.failed"
)

// EventTypes lists every event type a caller may filter on.
func EventTypes() []string {
	return []string{EventCreated, EventReady, EventHealth, EventEgressDenied, EventEgress, EventExpiringSoon, EventExpired, EventDeleted,
		EventTemplateBuildProgress, EventTemplateBuildDone, EventTemplateBuildFailed}
}

// Event is one record of GET /v1/events, sent as a server-sent event
// whose id is ID, whose event name is Type and whose data is this object.
type Event struct {
	// ID grows by one per event in this daemon's run; resume with
	// Last-Event-ID.
	ID      uint64    `json:"id"`
	Type    string    `json:"type"`
	Sandbox string    `json:"sandbox,omitempty"`
	Owner   string    `json:"owner,omitempty"`
	Time    time.Time `json:"time"`
	// Health is the new health (health events).
	Health *SandboxHealth `json:"health,omitempty"`
	// Denial is the refused name or connection (egress-denied events).
	Denial *EgressDenial `json:"denial,omitempty"`
	// Egress counts the sandbox's egress record since its previous
	// egress event (egress events).
	Egress *EgressCounts `json:"egress,omitempty"`
	// ExpiresAt is the sandbox's expiry (expiring-soon, expired).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Template names the template of a template.build event; VMID is
	// its id once known.
	Template string `json:"template,omitempty"`
	VMID     int    `json:"vmid,omitempty"`
	// Detail says more in a sentence (gap, deleted; a template build's
	// progress line or error).
	Detail string `json:"detail,omitempty"`
}
