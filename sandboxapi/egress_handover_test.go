package sandboxapi_test

import (
	"bufio"
	"encoding/json"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// takingEgress is gatedEgress that hands a deleted sandbox's record over
// (sandbox.EgressTaker): recordingEgress's records of it (VMIDs only;
// the engine names the VMs) and a dropped count, saying which sandboxes
// were taken and whether each handover was released after it was
// written.
type takingEgress struct {
	*gatedEgress
	dropped uint64
	// big adds so many records of a long name to each handover (an
	// answer past the connection's buffers)
	big int

	tmu      sync.Mutex
	taken    []string
	released []bool // per take: Release called
	early    bool   // a record written after its Release
}

func newTakingEgress() *takingEgress {
	return &takingEgress{gatedEgress: &gatedEgress{recordingEgress: &recordingEgress{fakeEgress: &fakeEgress{policies: map[string]apitype.EgressPolicy{}}},
		entered: make(chan struct{}), gate: make(chan struct{})}, dropped: 5}
}

func (f *takingEgress) TakeLog(id string) sandbox.EgressHandover {
	recs := f.recordingEgress.Log(id, sandbox.EgressLogFilter{}).Records
	for range f.big {
		recs = append(recs, apitype.EgressRecord{Seq: uint64(len(recs) + 1), Type: "dns", Verdict: "answered", Name: strings.Repeat("x", 240) + ".example"})
	}
	f.tmu.Lock()
	defer f.tmu.Unlock()
	f.taken = append(f.taken, id)
	f.released = append(f.released, false)
	return &fakeHandover{f: f, i: len(f.taken) - 1, recs: recs, dropped: f.dropped}
}

// releasedAll reports whether every handover was released.
func (f *takingEgress) releasedAll() bool {
	f.tmu.Lock()
	defer f.tmu.Unlock()
	return !slices.Contains(f.released, false)
}

type fakeHandover struct {
	f       *takingEgress
	i       int
	recs    []apitype.EgressRecord
	dropped uint64
}

func (h *fakeHandover) Len() int        { return len(h.recs) }
func (h *fakeHandover) Dropped() uint64 { return h.dropped }
func (h *fakeHandover) Next() uint64 {
	if len(h.recs) == 0 {
		return 0
	}
	return h.recs[len(h.recs)-1].Seq
}

func (h *fakeHandover) Each(fn func(apitype.EgressRecord) error) error {
	for _, r := range h.recs {
		h.f.tmu.Lock()
		if h.f.released[h.i] {
			h.f.early = true
		}
		h.f.tmu.Unlock()
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

func (h *fakeHandover) Release() {
	h.f.tmu.Lock()
	defer h.f.tmu.Unlock()
	h.f.released[h.i] = true
}

// TestDeleteEgressLog: DELETE /v1/sandboxes/{id}?egress_log=true
// deletes the sandbox and answers its whole egress record (every record
// the handover holds, oldest first, VMs named, its dropped count and the
// sandbox id), as JSON or NDJSON with the X-Egress-* headers, and lets
// it go once written; every refusal deletes nothing: egress_log not a
// boolean (400), another owner's sandbox (404, as the other routes), a
// node keeping no record (503); the owner's egress record reads all in
// flight do not stop it (it copies no page); a sandbox already gone is not-found
// with egress_log=true (its record went with it) and 204 without
// (DELETE stays idempotent); egress_log=false is the plain delete.
func TestDeleteEgressLog(t *testing.T) {
	cases := []struct {
		name string
		// egress is the node's egress part: "taking" (keeps and hands
		// over a record), "recording" (keeps one, hands none over),
		// "none" (no egress part)
		egress string
		caller string // alice (the owner) or bob
		query  string
		ndjson bool
		gone   bool // the sandbox deleted before the call
		hold   bool // alice's egress record reads all in flight
		status int
		// problem is the refusal's type ("" for a success), field its
		// field when set
		problem, field string
		deleted        bool
	}{
		{name: "the record handed over, JSON", egress: "taking", caller: "alice", query: "?egress_log=true", status: 200, deleted: true},
		{name: "the record handed over, NDJSON", egress: "taking", caller: "alice", query: "?egress_log=true", ndjson: true, status: 200, deleted: true},
		{name: "egress_log=false: the plain delete", egress: "taking", caller: "alice", query: "?egress_log=false", status: 204, deleted: true},
		{name: "egress_log not a boolean", egress: "taking", caller: "alice", query: "?egress_log=yes", status: 400, problem: apitype.ProblemInvalidRequest, field: "egress_log"},
		{name: "egress_log empty", egress: "taking", caller: "alice", query: "?egress_log=", status: 400, problem: apitype.ProblemInvalidRequest, field: "egress_log"},
		{name: "egress_log given twice", egress: "taking", caller: "alice", query: "?egress_log=false&egress_log=true", status: 400, problem: apitype.ProblemInvalidRequest, field: "egress_log"},
		{name: "another owner's sandbox", egress: "taking", caller: "bob", query: "?egress_log=true", status: 404, problem: apitype.ProblemNotFound},
		{name: "another owner's sandbox, no parameter", egress: "taking", caller: "bob", status: 404, problem: apitype.ProblemNotFound},
		{name: "sandbox gone", egress: "taking", caller: "alice", query: "?egress_log=true", gone: true, status: 404, problem: apitype.ProblemNotFound, deleted: true},
		{name: "sandbox gone, no parameter", egress: "taking", caller: "alice", gone: true, status: 204, deleted: true},
		{name: "node keeps a record it cannot hand over", egress: "recording", caller: "alice", query: "?egress_log=true", status: 503, problem: apitype.ProblemUnavailable},
		{name: "node without egress", egress: "none", caller: "alice", query: "?egress_log=true", status: 503, problem: apitype.ProblemUnavailable},
		{name: "owner's reads all in flight: the hand-over takes none", egress: "taking", caller: "alice", query: "?egress_log=true", hold: true, status: 200, deleted: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
			taking := newTakingEgress()
			e := newEnv(t, func(o *options) {
				o.Tokens = store
				switch tc.egress {
				case "taking":
					o.Egress = taking
				case "recording":
					o.Egress = taking.recordingEgress
				}
			})
			toks := map[string]string{}
			for _, owner := range []string{"alice", "bob"} {
				tok, _, err := store.CreateOwned(owner+"-agent", owner, []string{"admin"}, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				toks[owner] = tok
			}
			alice := client.New(e.tcp.URL, client.WithToken(toks["alice"]))
			ctx := e.ctx()
			sb, err := alice.Create(ctx, twoVMs())
			if err != nil {
				t.Fatal(err)
			}
			taking.vmids = []int{sb.VMs[0].VMID, sb.VMs[1].VMID}
			if tc.gone {
				if err := alice.Delete(ctx, sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			if tc.hold {
				defer taking.holdReads(ctx, t, alice, sb.ID)()
			}

			req, _ := http.NewRequest("DELETE", e.tcp.URL+"/v1/sandboxes/"+sb.ID+tc.query, nil)
			req.Header.Set("Authorization", "Bearer "+toks[tc.caller])
			if tc.ndjson {
				req.Header.Set("Accept", "application/x-ndjson")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			doc, err := e.c.OpenAPI(ctx)
			if err != nil {
				t.Fatal(err)
			}
			declared := declaredAnswer(t, doc, "/v1/sandboxes/{id}", "delete", resp.StatusCode)
			params, _ := doc["paths"].(map[string]any)["/v1/sandboxes/{id}"].(map[string]any)["delete"].(map[string]any)["parameters"].([]any)
			if !slices.ContainsFunc(params, func(p any) bool {
				m := p.(map[string]any)
				return m["name"] == "egress_log" && m["in"] == "query" && m["schema"].(map[string]any)["type"] == "boolean"
			}) {
				t.Errorf("the delete's parameters %v: no boolean egress_log", params)
			}
			switch {
			case tc.problem != "":
				p := decodeProblemResp(t, resp)
				if !declaresProblem(declared, p.Type) {
					t.Errorf("problem type %s not declared for %d: %v", p.Type, resp.StatusCode, declared)
				}
				if p.Type != tc.problem || tc.field != "" && p.Field != tc.field {
					t.Errorf("problem %+v, want %s (field %q)", p, tc.problem, tc.field)
				}
			case tc.status == http.StatusOK:
				checkHandover(t, resp, sb, tc.ndjson)
				content, _ := declared["content"].(map[string]any)
				headers, _ := declared["headers"].(map[string]any)
				if content[resp.Header.Get("Content-Type")] == nil || headers["X-Egress-Next"] == nil {
					t.Errorf("the document's 200 of the delete has no %s or no X-Egress-* headers: %v", resp.Header.Get("Content-Type"), declared)
				}
			}
			if _, ok := e.srv.Engine().Get(sb.ID); ok == tc.deleted {
				t.Errorf("sandbox there %v, want deleted %v", ok, tc.deleted)
			}
			want := 0
			if tc.status == http.StatusOK {
				want = 1
			}
			taking.tmu.Lock()
			taken := len(taking.taken)
			taking.tmu.Unlock()
			if taken != want {
				t.Errorf("%d records taken, want %d", taken, want)
			}
			// the handler lets the record go after its last byte: soon
			// after the client has read it
			for deadline := time.Now().Add(10 * time.Second); !taking.releasedAll() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if !taking.releasedAll() || taking.early {
				t.Errorf("released %v, a record written after its release %v", taking.released, taking.early)
			}
		})
	}
}

// declaredAnswer is the response the OpenAPI document declares for
// method path answering code (a failure when none is).
func declaredAnswer(t *testing.T, doc map[string]any, path, method string, code int) map[string]any {
	t.Helper()
	responses := doc["paths"].(map[string]any)[path].(map[string]any)[method].(map[string]any)["responses"].(map[string]any)
	r, ok := responses[strconv.Itoa(code)].(map[string]any)
	if !ok {
		t.Errorf("%s %s answers %d, which the document does not declare (it declares %v)", method, path, code, slices.Sorted(maps.Keys(responses)))
	}
	return r
}

// declaresProblem reports whether a declared response's problem
// document may be of type typ.
func declaresProblem(r map[string]any, typ string) bool {
	content, _ := r["content"].(map[string]any)
	pj, _ := content["application/problem+json"].(map[string]any)
	schema, _ := pj["schema"].(map[string]any)
	all, _ := schema["allOf"].([]any)
	if len(all) != 2 {
		return false
	}
	enum, _ := all[1].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["enum"].([]any)
	return slices.Contains(enum, any(typ))
}

// checkHandover checks a 200 answer of a delete with egress_log=true of
// sb, whose VMs takingEgress recorded a DNS and a connection record each.
func checkHandover(t *testing.T, resp *http.Response, sb apitype.Sandbox, ndjson bool) {
	t.Helper()
	var l apitype.EgressLog
	if ndjson {
		if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
			t.Fatalf("content type %q", ct)
		}
		l.Sandbox = sb.ID
		l.Dropped, _ = strconv.ParseUint(resp.Header.Get("X-Egress-Dropped"), 10, 64)
		l.Next, _ = strconv.ParseUint(resp.Header.Get("X-Egress-Next"), 10, 64)
		l.More = resp.Header.Get("X-Egress-More") != "false"
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var r apitype.EgressRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			l.Records = append(l.Records, r)
		}
	} else {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("content type %q", ct)
		}
		dec := json.NewDecoder(resp.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
	}
	var seqs []uint64
	var vms []string
	for _, r := range l.Records {
		seqs = append(seqs, r.Seq)
		vms = append(vms, r.VM+"/"+r.Type)
	}
	if l.Sandbox != sb.ID || l.Dropped != 5 || l.Next != 4 || l.More ||
		!slices.Equal(seqs, []uint64{1, 2, 3, 4}) || !slices.Equal(vms, []string{"a/dns", "a/conn", "b/dns", "b/conn"}) {
		t.Errorf("handed over %+v (seqs %v, VMs %v), want sandbox %s, 4 records of a and b, dropped 5, next 4", l, seqs, vms, sb.ID)
	}
}

// TestDeleteEgressLogStalledClient: the hand-over's records stay counted
// in the node's bound of egress records until written, so a client that
// stops reading the answer (or reads it a byte at a time) must not hold
// them for the route's deadline (TeardownTimeout + the SDN apply's + 30
// s: half an hour by default), while its owner creates, fills and
// deletes sandboxes again, each hand-over's room held on top of its live
// sandboxes' until other sandboxes' new records are dropped at the bound.
// The answer is written within Streams.WriteTimeout per 1024 records;
// past that the connection is cut and the records let go.
func TestDeleteEgressLogStalledClient(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	taking := newTakingEgress()
	taking.big = 40000 // about 12 MiB of JSON: more than the connection holds
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.Egress = taking
		o.Streams.WriteTimeout = 200 * time.Millisecond
	})
	tok, _, err := store.CreateOwned("a", "alice", []string{"admin"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	alice := client.New(e.tcp.URL, client.WithToken(tok))
	sb, err := alice.Create(e.ctx(), twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	for _, ndjson := range []bool{false, true} {
		accept := "application/json"
		if ndjson {
			accept = "application/x-ndjson"
		}
		c := stall(t, e, "DELETE /v1/sandboxes/"+sb.ID+"?egress_log=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tok+"\r\nAccept: "+accept+"\r\n\r\n", 0)
		// 40 WriteTimeouts for 40000 records (8 s) and a margin; the
		// route's deadline is minutes away
		for deadline := time.Now().Add(20 * time.Second); !taking.releasedAll() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if !taking.releasedAll() {
			t.Errorf("accept %s: the hand-over to a client that reads nothing is still held (released %v)", accept, taking.released)
		}
		c.Close()
		if _, ok := e.srv.Engine().Get(sb.ID); ok {
			t.Fatalf("sandbox %s not deleted", sb.ID)
		}
		if sb, err = alice.Create(e.ctx(), twoVMs()); err != nil {
			t.Fatal(err)
		}
	}
}
