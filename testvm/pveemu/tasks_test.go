package pveemu

import (
	"errors"
	"testing"
)

// TestTaskErrorMessage: a worker's die becomes the task's exit status as
// fork_worker writes it: chomped, newlines as spaces, a PVE::Exception with
// its code and its parameter errors.
func TestTaskErrorMessage(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"plain die", fail("storage 'x' does not exist"), "storage 'x' does not exist"},
		{"go error", errors.New("two\nlines\n"), "two lines"},
		{"parameter exception", paramFail(ParamErrors{"scsi2": "hotplug problem - busy", "delete": "no"}),
			"400 Parameter verification failed. delete: no scsi2: hotplug problem - busy"},
		{"permission", permFail("/storage/local-lvm, Datastore.AllocateSpace"),
			"403 Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := taskErrorMessage(tt.err); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}
