package pveapi_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestCloneToAnotherNodesVMID: against the emulator's two-node cluster,
// a clone on one node to the id of the other node's VM fails in its task
// with pmxcfs's rename error, which the client classifies as ErrExists
// (so a create takes another id), and VMIDFree asks the whole cluster.
func TestCloneToAnotherNodesVMID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	fb1, fb2 := pveemu.NewFakeBackend(filepath.Join(dir, "r1")), pveemu.NewFakeBackend(filepath.Join(dir, "r2"))
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb1, DataDir: filepath.Join(dir, "data"), StatsInterval: -1,
		Cluster: []pveemu.ClusterNode{{Name: "pve2", Backend: fb2}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = fb1.Close(); _ = fb2.Close() })
	disk := filepath.Join(dir, "disk")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{9000, 9001} {
		if err := s.AddTemplate(ctx, id, "tmpl", disk, map[string]string{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.MoveVM(9001, "pve2"); err != nil {
		t.Fatal(err)
	}
	id, secret, err := s.RootToken("cluster-test")
	if err != nil {
		t.Fatal(err)
	}
	h2, err := s.NodeHandler("pve2")
	if err != nil {
		t.Fatal(err)
	}
	ts1, ts2 := httptest.NewServer(s), httptest.NewServer(h2)
	t.Cleanup(func() { ts1.Close(); ts2.Close() })
	client := func(ts *httptest.Server, node string) *pveapi.Client {
		c, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: node, HTTPClient: ts.Client(), TaskPoll: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := client(ts1, "pve"), client(ts2, "pve2")
	if err := c2.CloneVM(ctx, sandbox.CloneSpec{Template: 9001, NewID: 150, Name: "on-pve2"}); err != nil {
		t.Fatal(err)
	}
	err = c1.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 150, Name: "on-pve"})
	if !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("clone on pve to pve2's 150: %v, want ErrExists", err)
	}
	for _, c := range []struct {
		id   int
		free bool
	}{{150, false}, {151, true}, {9001, false}} {
		if free, err := c1.VMIDFree(ctx, c.id); err != nil || free != c.free {
			t.Errorf("VMIDFree(%d) = %v %v, want %v", c.id, free, err, c.free)
		}
	}
}
