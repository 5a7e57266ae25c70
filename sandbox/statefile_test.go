package sandbox

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestStateMigration: a state file written by the version 1 daemon
// (testdata/state-v1.json, kept as written) loads into the same sandboxes
// as its version 2 rewrite (testdata/state-v2.json, golden), and files of
// an unknown version are refused with a clear error.
func TestStateMigration(t *testing.T) {
	v1, err := os.ReadFile("testdata/state-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	node, fromV1, err := decodeState(v1)
	if err != nil || node != "node1" || len(fromV1) != 2 {
		t.Fatalf("version 1: node %q, %d sandboxes, %v", node, len(fromV1), err)
	}
	if fromV1[1].Labels["eval"] != "ctf-1" || fromV1[0].Owner != "alice" || fromV1[0].Networks[0].CIDR != "192.168.50.0/24" || fromV1[1].VMs[1].DiskGiB != 20 {
		t.Errorf("version 1 decoded wrong: %+v", fromV1)
	}
	v2, err := encodeState(node, fromV1)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "state-v2.json", v2)
	_, fromV2, err := decodeState(v2)
	if err != nil || !reflect.DeepEqual(fromV2, fromV1) {
		t.Errorf("version 2 round trip: %v\n%+v\nwant %+v", err, fromV2, fromV1)
	}
	for doc, msg := range map[string]string{
		`{"version": 3, "node": "node1", "sandboxes": []}`: "version 3",
		`{"node": "node1", "sandboxes": []}`:               "no version",
		`{"version": "2"}`:                                 "cannot unmarshal",
		`[]`:                                               "cannot unmarshal",
	} {
		if _, _, err := decodeState([]byte(doc)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v, want an error naming %q", doc, err, msg)
		}
	}
}
