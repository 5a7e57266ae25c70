package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
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
	got, err := nd.px.StagedNetworkChanges(context.Background(), "")
	if err != nil || got != diff {
		t.Fatalf("staged changes read with the daemon's token: %q %v", got, err)
	}
	o := run(t, NetworkCheck(nd.px, nd.n))
	if o.Status != Fail || !strings.Contains(o.Detail, "iface vmbr9") || !strings.Contains(o.Detail, "pve:\n") || !strings.Contains(o.Fix, "pvesh delete /nodes/<node>/network") {
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

// stagedNodes is a cluster whose nodes have the staged diffs given
// (err: every read fails); a node named "down" is offline.
type stagedNodes struct {
	diffs map[string]string
	err   error
}

func (f stagedNodes) Get(_ context.Context, path string, v any) error {
	if path != "/nodes" {
		return errors.New("unexpected " + path)
	}
	var out []map[string]string
	for _, n := range slices.Sorted(maps.Keys(f.diffs)) {
		st := "online"
		if n == "down" {
			st = "offline"
		}
		out = append(out, map[string]string{"node": n, "status": st})
	}
	b, _ := json.Marshal(out)
	return json.Unmarshal(b, v)
}

func (f stagedNodes) StagedNetworkChanges(_ context.Context, node string) (string, error) {
	if node == "down" {
		return "", errors.New("595 no route")
	}
	return f.diffs[node], f.err
}

// TestNetworkCheckOutcomes: the check's answer for each cluster, every
// node's edits named, a node that is down named and not read, a long diff
// cut to its first lines.
func TestNetworkCheckOutcomes(t *testing.T) {
	long := strings.Repeat("+line\n", 40)
	for _, c := range []struct {
		name   string
		diffs  map[string]string
		err    error
		status Status
		detail []string
	}{
		{"none", map[string]string{"pve1": "", "pve2": ""}, nil, Pass, []string{"none staged on 2 node(s)"}},
		{"blank", map[string]string{"pve1": " \n"}, nil, Pass, []string{"none staged"}},
		{"another node's edit", map[string]string{"pve1": "", "pve2": "+auto vmbr9\n"}, nil, Fail, []string{"pve2:\n+auto vmbr9"}},
		{"two nodes", map[string]string{"pve1": "+a\n", "pve2": "+b\n"}, nil, Fail, []string{"pve1:\n+a", "pve2:\n+b"}},
		{"a node down", map[string]string{"pve1": "", "down": "+x\n"}, nil, Pass, []string{"none staged on 1 node(s)", "not read (node down): down"}},
		{"long diff cut", map[string]string{"pve1": long}, nil, Fail, []string{"..."}},
		{"unreadable", map[string]string{"pve1": ""}, errors.New("500 boom"), Fail, []string{"500 boom"}},
	} {
		o := run(t, NetworkCheck(stagedNodes{diffs: c.diffs, err: c.err}, Node{Name: "pve1"}))
		if o.Status != c.status {
			t.Errorf("%s: %+v", c.name, o)
		}
		for _, d := range c.detail {
			if !strings.Contains(o.Detail, d) {
				t.Errorf("%s: detail %q lacks %q", c.name, o.Detail, d)
			}
		}
		if c.name == "long diff cut" && strings.Count(o.Detail, "+line") > 12 {
			t.Errorf("long diff not cut: %d lines", strings.Count(o.Detail, "+line"))
		}
	}
}
