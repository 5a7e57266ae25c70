package nsrun

import (
	"errors"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestDo: fn sees the target namespace, its error comes back, and the
// caller's thread never leaves its own namespace.
func TestDo(t *testing.T) {
	testkit.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	here, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer here.Close()
	target := testkit.NewNetNS(t, "pnr").Handle()
	if target.Equal(here) {
		t.Fatal("the new namespace is the caller's")
	}

	tests := []struct {
		name  string
		ns    *netns.NsHandle
		want  netns.NsHandle
		fnErr error
	}{
		{"nil runs here", nil, here, nil},
		{"target", &target, target, nil},
		{"error passes through", &target, target, errors.New("boom")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen netns.NsHandle
			err := Do(tt.ns, func() error {
				var err error
				seen, err = netns.Get()
				if err != nil {
					return err
				}
				return tt.fnErr
			})
			defer seen.Close()
			if tt.fnErr != nil {
				if !errors.Is(err, tt.fnErr) {
					t.Fatalf("error %v, want %v", err, tt.fnErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !seen.Equal(tt.want) {
				t.Errorf("fn ran in %v, want %v", seen, tt.want)
			}
			now, err := netns.Get()
			if err != nil {
				t.Fatal(err)
			}
			defer now.Close()
			if !now.Equal(here) {
				t.Error("the caller's thread left its namespace")
			}
		})
	}
}
