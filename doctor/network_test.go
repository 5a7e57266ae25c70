package doctor

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestNetworkCheck: a staged edit of the host network (interfaces.new,
// shown as the "changes" of GET /nodes/{node}/network to the daemon's own
// token) fails the check with the diff and how to apply or revert it;
// once an SDN apply has made it live (every apply reloads every node,
// renaming interfaces.new first) the check passes again.
func TestNetworkCheck(t *testing.T) {
	nd := newNode(t)
	if o := run(t, NetworkCheck(nd.px, nd.n)); o.Status != Pass {
		t.Fatalf("nothing staged: %+v", o)
	}
	diff := "--- /etc/network/interfaces\n+++ /etc/network/interfaces.new\n@@ -10,0 +11,3 @@\n+auto vmbr9\n+iface vmbr9 inet static\n+\taddress 192.0.2.1/24\n"
	if err := nd.emu.StageNetworkEdit("pve", diff); err != nil {
		t.Fatal(err)
	}
	got, err := nd.px.StagedNetworkChanges(context.Background())
	if err != nil || got != diff {
		t.Fatalf("staged changes read with the daemon's token: %q %v", got, err)
	}
	o := run(t, NetworkCheck(nd.px, nd.n))
	if o.Status != Fail || !strings.Contains(o.Detail, "iface vmbr9") || !strings.Contains(o.Fix, "pvesh delete /nodes/pve/network") {
		t.Fatalf("staged edit: %+v", o)
	}
	// the daemon's next apply makes it live: what the check warned of
	if err := nd.px.ApplySDN(context.Background()); err != nil {
		t.Fatal(err)
	}
	if applied := nd.emu.AppliedNetworkEdits("pve"); !slices.Equal(applied, []string{diff}) {
		t.Errorf("edits the apply made live: %q", applied)
	}
	if o := run(t, NetworkCheck(nd.px, nd.n)); o.Status != Pass {
		t.Errorf("after the apply: %+v", o)
	}
}

type stagedFunc func(context.Context) (string, error)

func (f stagedFunc) StagedNetworkChanges(ctx context.Context) (string, error) { return f(ctx) }

// TestNetworkCheckOutcomes: the check's answer for each reply, a long
// diff cut to its first lines.
func TestNetworkCheckOutcomes(t *testing.T) {
	long := strings.Repeat("+line\n", 40)
	for _, c := range []struct {
		name   string
		diff   string
		err    error
		status Status
		detail string
	}{
		{"none", "", nil, Pass, "none staged"},
		{"blank", " \n", nil, Pass, "none staged"},
		{"one edit", "+auto vmbr9\n", nil, Fail, "+auto vmbr9"},
		{"long diff cut", long, nil, Fail, "..."},
		{"unreadable", "", errors.New("595 no route"), Fail, "595 no route"},
	} {
		o := run(t, NetworkCheck(stagedFunc(func(context.Context) (string, error) { return c.diff, c.err }), Node{Name: "pve"}))
		if o.Status != c.status || !strings.Contains(o.Detail, c.detail) {
			t.Errorf("%s: %+v", c.name, o)
		}
		if c.name == "long diff cut" && strings.Count(o.Detail, "+line") > 12 {
			t.Errorf("long diff not cut: %d lines", strings.Count(o.Detail, "+line"))
		}
	}
}
