package containment

import (
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// TestCrossCheckIDMap (review finding): the id map row is judged on the
// node's reading of the container's init, and a probe report whose maps
// differ from it (a container root answering for the probe) fails the
// row as forged, whatever the report says.
func TestCrossCheckIDMap(t *testing.T) {
	unpriv := []probe.IDExtent{{Type: "uid", Inside: 0, Outside: 100000, Count: 65536}, {Type: "gid", Inside: 0, Outside: 100000, Count: 65536}}
	const nodeUnpriv, nodePriv = "         0     100000      65536\n", "0 0 4294967295\n"
	for _, tc := range []struct {
		name      string
		probeMaps []probe.IDExtent
		uid, gid  string
		readErr   error
		observed  Verdict
		pass      bool
		inDetail  string
		inWhy     string
	}{
		{name: "the probe and the node agree: unprivileged", probeMaps: unpriv, uid: nodeUnpriv, gid: nodeUnpriv, observed: Denied, pass: true, inDetail: "agrees"},
		{name: "the probe and the node agree: the node's root", probeMaps: []probe.IDExtent{{Type: "uid", Count: 4294967295}, {Type: "gid", Count: 4294967295}},
			uid: nodePriv, gid: nodePriv, observed: Allowed, inWhy: "LEAK"},
		{name: "a forged report of a privileged container", probeMaps: unpriv, uid: nodePriv, gid: nodePriv, observed: Allowed, inWhy: "FORGED"},
		{name: "a forged report of an unprivileged one", probeMaps: []probe.IDExtent{{Type: "uid", Outside: 200000, Count: 65536}, {Type: "gid", Outside: 200000, Count: 65536}},
			uid: nodeUnpriv, gid: nodeUnpriv, observed: Denied, inWhy: "FORGED"},
		{name: "the node cannot read them", probeMaps: unpriv, readErr: errors.New("lxc-info: not running"), observed: Errored, inDetail: "lxc-info"},
		{name: "the probe gave none", uid: nodeUnpriv, gid: nodeUnpriv, observed: Errored, inDetail: "reported no maps"},
		{name: "the node's text does not parse", probeMaps: unpriv, uid: "0 100000\n", gid: nodeUnpriv, observed: Errored, inDetail: "want 3 fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, d := judgeIDMap(tc.probeMaps)
			res := &Result{Rows: []Row{
				{Name: "id map", Expect: Denied, Observed: v, Detail: d, Status: Pass, kind: probe.KindIDMap, idmap: tc.probeMaps},
				{Name: "other", Expect: Denied, Observed: Denied, Status: Pass, kind: probe.KindKeyring},
			}}
			crossCheckIDMap(res, tc.uid, tc.gid, tc.readErr)
			row := res.Rows[0]
			if row.Observed != tc.observed || (row.Status == Pass) != tc.pass || res.Pass != tc.pass {
				t.Errorf("row %+v, result pass %v; want observed %s, pass %v", row, res.Pass, tc.observed, tc.pass)
			}
			if !strings.Contains(row.Detail, tc.inDetail) || !strings.Contains(row.Why, tc.inWhy) {
				t.Errorf("detail %q, why %q; want %q and %q in them", row.Detail, row.Why, tc.inDetail, tc.inWhy)
			}
			if res.Rows[1].Status != Pass {
				t.Errorf("another row changed: %+v", res.Rows[1])
			}
		})
	}
}
