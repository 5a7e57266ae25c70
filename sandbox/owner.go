package sandbox

import "context"

// ownerKey is the context key of the owner a guest call is made for.
type ownerKey struct{}

// WithOwner returns ctx marked as a call for the sandboxes of owner: the
// guest agent client charges what it buffers for the call to that owner's
// share (qga.Budget). The API marks every guest I/O call with the owner of
// the sandbox it targets.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerOf returns the owner ctx was marked with, and whether it was.
func OwnerOf(ctx context.Context) (string, bool) {
	o, ok := ctx.Value(ownerKey{}).(string)
	return o, ok
}

// PoolOwner is the owner the daemon's calls into warm pool members are
// charged to until a member is claimed: no tenant's name (owner names
// begin with a letter or a digit, auth.ValidName).
const PoolOwner = "(pool)"

// ownerLabel is owner as a metric label: "" is "-".
func ownerLabel(owner string) string {
	if owner == "" {
		return "-"
	}
	return owner
}
