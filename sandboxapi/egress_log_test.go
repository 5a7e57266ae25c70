package sandboxapi_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// recordingEgress is fakeEgress keeping an egress record: one DNS and
// one connection record per VMID in vmids, and the filter last asked.
type recordingEgress struct {
	*fakeEgress
	vmids []int
	asked sandbox.EgressLogFilter
}

func (f *recordingEgress) Log(id string, q sandbox.EgressLogFilter) apitype.EgressLog {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = q
	out := apitype.EgressLog{Sandbox: id, Records: []apitype.EgressRecord{}}
	for _, vmid := range f.vmids {
		if q.VMID != 0 && vmid != q.VMID {
			continue
		}
		for _, typ := range []string{"dns", "conn"} {
			if q.Type == "" || q.Type == typ {
				out.Records = append(out.Records, apitype.EgressRecord{Seq: uint64(len(out.Records) + 1), Type: typ, VMID: vmid, Verdict: "allowed"})
			}
		}
	}
	return out
}

// TestEgressLogScope: GET .../egress/log is owner-scoped like the other
// sandbox routes (another owner's token: not-found), a read token reads
// it, VMs are named, the filters reach the egress part and bad ones are
// refused; NDJSON on request; a node keeping no record answers
// unavailable.
func TestEgressLogScope(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	rec := &recordingEgress{fakeEgress: &fakeEgress{policies: map[string]apitype.EgressPolicy{}}}
	e := newEnv(t, func(o *options) { o.Tokens, o.Egress = store, rec })
	mint := func(name, owner, scope string) (*client.Client, string) {
		t.Helper()
		tok, _, err := store.CreateOwned(name, owner, []string{scope}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return client.New(e.tcp.URL, client.WithToken(tok)), tok
	}
	alice, _ := mint("alice-agent", "alice", "admin")
	aliceRead, readTok := mint("alice-read", "alice", "read")
	bob, _ := mint("bob-agent", "bob", "admin")
	ctx := e.ctx()
	sb, err := alice.Create(ctx, twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	rec.vmids = []int{sb.VMs[0].VMID, sb.VMs[1].VMID}

	if _, err := bob.EgressLog(ctx, sb.ID, apitype.EgressLogQuery{}); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("bob reading alice's egress record: %v, want not-found", err)
	}
	l, err := aliceRead.EgressLog(ctx, sb.ID, apitype.EgressLogQuery{})
	if err != nil || len(l.Records) != 4 || l.Sandbox != sb.ID {
		t.Fatalf("alice's read token: %+v %v", l, err)
	}
	if l.Records[0].VM != "a" || l.Records[2].VM != "b" {
		t.Errorf("VMs not named: %+v", l.Records)
	}
	l, err = aliceRead.EgressLog(ctx, sb.ID, apitype.EgressLogQuery{Type: "conn", VM: "b", Since: 7, Limit: 5})
	want := sandbox.EgressLogFilter{Type: "conn", VMID: sb.VMs[1].VMID, Since: 7, Limit: 5}
	if err != nil || len(l.Records) != 1 || rec.asked != want {
		t.Errorf("filtered: %+v %v, asked %+v, want %+v", l, err, rec.asked, want)
	}
	l, err = aliceRead.EgressLog(ctx, sb.ID, apitype.EgressLogQuery{Type: "flow"})
	if err != nil || rec.asked.Type != "flow" {
		t.Errorf("kernel flows: %+v %v, asked %+v", l, err, rec.asked)
	}
	for _, q := range []apitype.EgressLogQuery{{Type: "udp"}, {VM: "nope"}, {Limit: sandbox.MaxEgressLogLimit + 1}} {
		if _, err := aliceRead.EgressLog(ctx, sb.ID, q); !client.IsProblem(err, apitype.ProblemInvalidRequest) {
			t.Errorf("%+v: %v, want invalid-request", q, err)
		}
	}

	req, _ := http.NewRequest("GET", e.tcp.URL+"/v1/sandboxes/"+sb.ID+"/egress/log?type=dns", nil)
	req.Header.Set("Authorization", "Bearer "+readTok)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/x-ndjson" || resp.Header.Get("X-Egress-Next") == "" {
		t.Fatalf("NDJSON: %d %q %v", resp.StatusCode, ct, resp.Header)
	}
	var lines int
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var r apitype.EgressRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Type != "dns" || r.VM == "" {
			t.Errorf("line %q: %+v %v", sc.Text(), r, err)
		}
		lines++
	}
	if lines != 2 {
		t.Errorf("%d NDJSON lines, want 2", lines)
	}

	plain := newEnv(t, func(o *options) { o.Egress = &fakeEgress{policies: map[string]apitype.EgressPolicy{}} })
	psb := plain.create(twoVMs())
	if _, err := plain.c.EgressLog(plain.ctx(), psb.ID, apitype.EgressLogQuery{}); !client.IsProblem(err, apitype.ProblemUnavailable) {
		t.Errorf("a node keeping no record: %v, want unavailable", err)
	}
}
