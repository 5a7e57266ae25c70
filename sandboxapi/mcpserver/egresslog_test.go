package mcpserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// recordEgress is an egress part keeping an egress record of n DNS
// records for every sandbox, seq 1..n.
type recordEgress struct {
	n  int
	mu sync.Mutex
	// asked is the last filter the record was read with.
	asked sandbox.EgressLogFilter
}

func (*recordEgress) Validate(apitype.EgressPolicy) error { return nil }
func (*recordEgress) Set(context.Context, string, string, []string, apitype.EgressPolicy) error {
	return nil
}
func (*recordEgress) Remove(context.Context, string, string) error { return nil }
func (*recordEgress) Status(sb, _ string) apitype.EgressStatus {
	return apitype.EgressStatus{Sandbox: sb, Policy: apitype.EgressPolicy{Mode: "open"}}
}

func (f *recordEgress) Log(id string, q sandbox.EgressLogFilter) apitype.EgressLog {
	f.mu.Lock()
	f.asked = q
	f.mu.Unlock()
	out := apitype.EgressLog{Sandbox: id, Records: []apitype.EgressRecord{}, Next: q.Since}
	for seq := q.Since + 1; seq <= uint64(f.n); seq++ {
		if len(out.Records) == q.Limit {
			out.More = true
			break
		}
		out.Records = append(out.Records, apitype.EgressRecord{Seq: seq, Type: "dns", Verdict: "answered", Name: "example.org"})
		out.Next = seq
	}
	return out
}

// TestEgressLogTool: sandbox_egress_log is a read tool that returns the
// sandbox's egress record page by page (since = the last page's next);
// another owner's token gets not-found, as from every sandbox tool; the
// limit is bounded and a bad filter is the API's invalid-request.
func TestEgressLogTool(t *testing.T) {
	toks := ownedTokens{
		"a": {name: "alice-ci", owner: "alice", scopes: []string{apitype.ScopeAdmin}},
		"r": {name: "alice-read", owner: "alice", scopes: []string{apitype.ScopeRead}},
		"b": {name: "bob-ci", owner: "bob", scopes: []string{apitype.ScopeAdmin}},
	}
	eg := &recordEgress{n: 5}
	b := newBed(t, bedOpts{tokens: toks, api: func(o *sandbox.Options) { o.Egress = eg }})
	hs := httptest.NewServer(mcpserver.HTTPHandler(toks, func(tok string) mcpserver.API {
		return client.NewInProcess(b.srv.Handler(), client.WithToken(tok))
	}, mcpserver.Options{DefaultTemplate: "debian"}))
	t.Cleanup(hs.Close)
	session := func(tok string) *mcp.ClientSession {
		return b.connect(b.ctx(), &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: testkit.Bearer{Token: tok}}})
	}
	alice, aliceRead, bob := session("a"), session("r"), session("b")
	sb := ok[apitype.Sandbox](t, "create", callOn(t, b.ctx(), alice, mcpserver.ToolCreate, nil))

	var seqs []uint64
	since, pages := uint64(0), 0
	for {
		l := ok[apitype.EgressLog](t, "egress log", callOn(t, b.ctx(), aliceRead, mcpserver.ToolEgressLog, map[string]any{"id": sb.ID, "since": since, "limit": 2}))
		pages++
		for _, r := range l.Records {
			seqs = append(seqs, r.Seq)
		}
		if l.Sandbox != sb.ID || !l.More {
			break
		}
		since = l.Next
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5}) || pages != 3 {
		t.Errorf("paged %v in %d pages, want 1..5 in 3", seqs, pages)
	}
	ok[apitype.EgressLog](t, "egress log", callOn(t, b.ctx(), aliceRead, mcpserver.ToolEgressLog, map[string]any{"id": sb.ID, "type": "dns"}))
	if eg.asked.Limit != mcpserver.DefaultEgressLogRecords || eg.asked.Type != "dns" {
		t.Errorf("asked %+v, want type dns and the default limit", eg.asked)
	}

	for _, tc := range []struct {
		name string
		s    *mcp.ClientSession
		args map[string]any
		want string
	}{
		{"another owner", bob, map[string]any{"id": sb.ID}, apitype.ProblemNotFound},
		{"empty id", aliceRead, map[string]any{"id": " "}, apitype.ProblemInvalidRequest},
		{"limit past the bound", aliceRead, map[string]any{"id": sb.ID, "limit": mcpserver.MaxEgressLogRecords + 1}, apitype.ProblemInvalidRequest},
		{"bad type", aliceRead, map[string]any{"id": sb.ID, "type": "udp"}, apitype.ProblemInvalidRequest},
		{"unknown vm", aliceRead, map[string]any{"id": sb.ID, "vm": "nope"}, apitype.ProblemInvalidRequest},
	} {
		if p := problem(t, tc.name, callOn(t, b.ctx(), tc.s, mcpserver.ToolEgressLog, tc.args)); p.Type != tc.want {
			t.Errorf("%s: %+v, want %s", tc.name, p, tc.want)
		}
	}
}
