package sandboxapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// fuzzCall sends one request to the local handler and checks the answer is
// the success status or a well-formed client-error problem document; on a
// problem nothing may have changed in Proxmox or in the sandbox list.
func fuzzCall(t *testing.T, e *env, req *http.Request, okStatus int) *httptest.ResponseRecorder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := e.px.Mutations()
	listBefore, err := e.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	e.srv.LocalHandler().ServeHTTP(rec, req)
	if rec.Code == okStatus {
		return rec
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with content type %q: %s", rec.Code, ct, rec.Body.Bytes())
	}
	var p apitype.Problem
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem document does not decode: %v: %s", err, rec.Body.Bytes())
	}
	if p.Status != rec.Code || !slices.Contains(apitype.ProblemTypes(), p.Type) || p.Title == "" {
		t.Fatalf("bad problem %+v for status %d", p, rec.Code)
	}
	if p.Status >= 500 {
		t.Fatalf("server error for client input: %+v", p)
	}
	if e.px.Mutations() != before {
		t.Fatalf("refused request changed Proxmox (%d -> %d): %+v", before, e.px.Mutations(), p)
	}
	listAfter, _ := e.c.List(ctx)
	if len(listAfter) != len(listBefore) {
		t.Fatalf("refused request changed the sandboxes: %d -> %d", len(listBefore), len(listAfter))
	}
	return rec
}

func FuzzCreateRequest(f *testing.F) {
	for _, s := range []string{
		`{"vms":[{"template":"debian"}]}`,
		`{"vms":[{"name":"a","template":"debian","cores":2,"memory_mib":2048,"disk_gib":10,"networks":["n"]}],"networks":[{"name":"n","cidr":"10.1.0.0/24","dhcp":false,"snat":true}],"labels":{"k":"v"},"ttl_seconds":60}`,
		`{"vms":[{"template":"debian"}],"extra":1}`,
		`{"vms":[{"template":"debian","cores":-1}]}`,
		`{"vms":[{"template":"debian","memory_mib":1e300}]}`,
		`{"vms":[{"template":"deb\u0000ian"}]}`,
		`{"vms":[{"template":"debian"}],"networks":[{"name":"n","cidr":"10.0.0.1/8"}]}`,
		`[]`, `null`, `{}`, ``, `{"vms":[{"template":"debian"}]}garbage`,
	} {
		f.Add([]byte(s))
	}
	e := newEnv(f, func(o *options) { o.Caps.NodeSandboxes = 1000 })
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", "/v1/sandboxes", bytes.NewReader(body))
		rec := fuzzCall(t, e, req, http.StatusCreated)
		if rec.Code == http.StatusCreated {
			var sb apitype.Sandbox
			if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil {
				t.Fatal(err)
			}
			del := httptest.NewRecorder()
			e.srv.LocalHandler().ServeHTTP(del, httptest.NewRequest("DELETE", "/v1/sandboxes/"+sb.ID, nil))
			if del.Code != http.StatusNoContent {
				t.Fatalf("delete: %d %s", del.Code, del.Body.Bytes())
			}
		}
	})
}

// fuzzSandbox creates one sandbox for the per-VM fuzzers.
func fuzzSandbox(f *testing.F) (*env, apitype.Sandbox) {
	e := newEnv(f, nil)
	sb, err := e.c.Create(context.Background(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		f.Fatal(err)
	}
	return e, sb
}

func FuzzExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"argv":["echo","hi"]}`,
		`{"argv":["cat"],"stdin":"aGVsbG8=","cwd":"/tmp","env":{"A":"B"},"user":"root","timeout_seconds":5,"output_limit":100}`,
		`{"argv":[]}`, `{"argv":["a\u0000"]}`, `{"argv":["x"],"env":{"A=B":"c"}}`,
		`{"argv":["x"],"timeout_seconds":1e20}`, `{"argv":["x"],"stdin":"!!"}`, `{"argv":["x"],"cwd":"rel"}`,
		`{"argv":"x"}`, `{"argv":["x"],"unknown":true}`,
	} {
		f.Add([]byte(s), false)
	}
	e, sb := fuzzSandbox(f)
	f.Fuzz(func(t *testing.T, body []byte, stream bool) {
		req := httptest.NewRequest("POST", "/v1/sandboxes/"+sb.ID+"/vms/vm0/exec", bytes.NewReader(body))
		if stream {
			req.Header.Set("Accept", "application/x-ndjson")
		}
		fuzzCall(t, e, req, http.StatusOK)
	})
}

func FuzzFilePath(f *testing.F) {
	for _, s := range []string{"/etc/hostname", "", "relative", "/a\x00b", "/" + string(make([]byte, 5000)), "/dir/", "/\xff\xfe"} {
		f.Add(s, "0644", []byte("data"))
	}
	e, sb := fuzzSandbox(f)
	f.Fuzz(func(t *testing.T, path, mode string, data []byte) {
		q := url.Values{"path": {path}, "mode": {mode}}.Encode()
		put := httptest.NewRequest("PUT", "/v1/sandboxes/"+sb.ID+"/vms/vm0/files?"+q, bytes.NewReader(data))
		if rec := fuzzCall(t, e, put, http.StatusNoContent); rec.Code != http.StatusNoContent {
			return
		}
		get := httptest.NewRequest("GET", "/v1/sandboxes/"+sb.ID+"/vms/vm0/files?"+url.Values{"path": {path}}.Encode(), nil)
		rec := fuzzCall(t, e, get, http.StatusOK)
		if rec.Code == http.StatusOK && !bytes.Equal(rec.Body.Bytes(), data) {
			t.Fatalf("read back %d bytes, wrote %d", rec.Body.Len(), len(data))
		}
	})
}

func FuzzExtendRequest(f *testing.F) {
	for _, s := range []string{`{"ttl_seconds":60}`, `{"ttl_seconds":-5}`, `{"ttl_seconds":1e30}`, `{"ttl":5}`, `{}`, `"x"`} {
		f.Add([]byte(s))
	}
	e, sb := fuzzSandbox(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("POST", "/v1/sandboxes/"+sb.ID+"/extend", bytes.NewReader(body))
		fuzzCall(t, e, req, http.StatusOK)
	})
}
