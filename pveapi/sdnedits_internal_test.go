package pveapi

import "testing"

// TestEditMadeAgainDuringTheCheckStays: EditsCommitted takes a
// snapshot of the client's edits, lists the pending objects, and drops
// the snapshot's keys (sdnEdits.drop: "edits made since stay"). An edit
// made between the two on an object already in the snapshot (its key is
// the same: the sandbox's delete of a zone, vnet or subnet it created and
// a foreign apply committed; claimSubnet's backoff deleting the subnet it
// just made) is dropped with it: the deletion stays pending in the
// cluster but no longer in the client's edits, so a later EditsCommitted
// whose other edits are committed says true and the delete's apply
// (deleteSDN, which checks no bridge afterwards) is skipped. A generation
// per key (drop only keys not written again since the snapshot) keeps it.

func TestEditMadeAgainDuringTheCheckStays(t *testing.T) {
	e := newSDNEdits()
	e.add("zone", "sbaaaaaa")
	snap := e.snapshot()
	e.add("zone", "sbaaaaaa") // DeleteZone records it, then deletes it
	e.drop(snap)
	if _, ok := e.snapshot()["zone sbaaaaaa"]; !ok {
		t.Error("the zone's deletion, recorded after the snapshot, was dropped with the snapshot's create")
	}
}
