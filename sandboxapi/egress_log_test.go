package sandboxapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	for _, q := range []apitype.EgressLogQuery{{Type: "udp"}, {VM: "nope"}, {Limit: sandbox.MaxEgressLogLimit + 1}, {Since: 1 << 63}} {
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

// TestOpenAPIEgressLogHeaders: the NDJSON answer of GET .../egress/log
// carries the page's dropped, next and more in X-Egress-* headers (the
// records are its lines); the document declares each header the answer
// sets, with its type, so a client of the document can page.
func TestOpenAPIEgressLogHeaders(t *testing.T) {
	rec := &recordingEgress{fakeEgress: &fakeEgress{policies: map[string]apitype.EgressPolicy{}}, vmids: []int{0}}
	e := newEnv(t, func(o *options) { o.Egress = rec })
	sb := e.create(twoVMs())
	doc, err := e.c.OpenAPI(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	ok := doc["paths"].(map[string]any)["/v1/sandboxes/{id}/egress/log"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)["200"].(map[string]any)
	headers, _ := ok["headers"].(map[string]any)
	req, _ := http.NewRequest("GET", e.http.URL+"/v1/sandboxes/"+sb.ID+"/egress/log", nil)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("NDJSON read: %d", resp.StatusCode)
	}
	for _, tc := range []struct{ name, typ string }{{"X-Egress-Dropped", "integer"}, {"X-Egress-Next", "integer"}, {"X-Egress-More", "boolean"}} {
		if resp.Header.Get(tc.name) == "" {
			t.Errorf("the NDJSON answer has no %s", tc.name)
		}
		h, _ := headers[tc.name].(map[string]any)
		schema, _ := h["schema"].(map[string]any)
		if schema["type"] != tc.typ || h["description"] == "" {
			t.Errorf("%s declared as %v, want a described %s", tc.name, h, tc.typ)
		}
	}
}

// gatedEgress holds every read of one sandbox's record until gate is
// closed, saying on entered that one is held.
type gatedEgress struct {
	*recordingEgress
	id      string
	entered chan struct{}
	gate    chan struct{}
}

func (f *gatedEgress) Log(id string, q sandbox.EgressLogFilter) apitype.EgressLog {
	if id == f.id {
		select {
		case f.entered <- struct{}{}:
			<-f.gate
		case <-f.gate: // open: nothing is held any more
		}
	}
	return f.recordingEgress.Log(id, q)
}

// TestEgressLogReadsHaveShares: a read holds its page until written, so
// the reads in flight have a per-owner share (2) and a node total: an
// owner's third read at once is refused with 429 and the quota named,
// while another owner still reads.
func TestEgressLogReadsHaveShares(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	g := &gatedEgress{recordingEgress: &recordingEgress{fakeEgress: &fakeEgress{policies: map[string]apitype.EgressPolicy{}}},
		entered: make(chan struct{}), gate: make(chan struct{})}
	e := newEnv(t, func(o *options) { o.Tokens, o.Egress = store, g })
	mint := func(name, owner string) *client.Client {
		t.Helper()
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return client.New(e.tcp.URL, client.WithToken(tok))
	}
	alice, bob := mint("alice", "alice"), mint("bob", "bob")
	ctx := e.ctx()
	asb, err := alice.Create(ctx, twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	bsb, err := bob.Create(ctx, twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	free := g.holdReads(ctx, t, alice, asb.ID)
	_, err = alice.EgressLog(ctx, asb.ID, apitype.EgressLogQuery{})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Type != apitype.ProblemTooManyRequests || p.Quota != "egress-log-reads" {
		t.Errorf("alice's third read at once: %v, want too-many-requests naming egress-log-reads", err)
	}
	if _, err := bob.EgressLog(ctx, bsb.ID, apitype.EgressLogQuery{}); err != nil {
		t.Errorf("bob's read while alice holds her share: %v", err)
	}
	free()
	if _, err := alice.EgressLog(ctx, asb.ID, apitype.EgressLogQuery{}); err != nil {
		t.Errorf("alice's read after hers ended: %v", err)
	}
}

// holdReads makes c read sandbox id's egress record twice (an owner's
// whole share of reads) and returns once both are held; free lets them
// end and checks they succeeded.
func (f *gatedEgress) holdReads(ctx context.Context, t *testing.T, c *client.Client, id string) (free func()) {
	t.Helper()
	f.id = id
	held := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.EgressLog(ctx, id, apitype.EgressLogQuery{})
			held <- err
		}()
		<-f.entered
	}
	return func() {
		close(f.gate)
		for range 2 {
			if err := <-held; err != nil {
				t.Errorf("a held read: %v", err)
			}
		}
	}
}
