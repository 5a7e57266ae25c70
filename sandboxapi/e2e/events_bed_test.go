package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestBedEventsNeighbour (issue 34, finding 2): on the node in a box,
// through the API's token listener with the shipped stream caps, tenant A
// opens event streams with the largest filters the API takes until its
// token and then its owner are full: the next is a 429 too-many-requests
// with Retry-After, counted for A, and a filter past the bound is a 400.
// Tenant B can still open a stream, and it carries B's own sandbox's
// events and none of A's. Before, A could open any number of streams with
// filters of any length, every one scanned under the bus's lock at each
// publish.
func TestBedEventsNeighbour(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	reg := prometheus.NewRegistry()
	e := newBedEnv(t, ctx, func(o *options) {
		o.Tokens = store
		o.serverOptions.Registerer = reg
	})
	ts := httptest.NewServer(e.srv.Handler())
	t.Cleanup(ts.Close)
	mint := func(name, owner string) string {
		tok, _, err := store.CreateOwned(name, owner, []string{apitype.ScopeAdmin}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	a1, a2, a3, b := mint("a1", "tenant-a"), mint("a2", "tenant-a"), mint("a3", "tenant-a"), mint("b", "tenant-b")
	bOpened := testkit.NewStreamOpened("/v1/events")
	ca, cb := client.New(ts.URL, client.WithToken(a1)), client.New(ts.URL, client.WithToken(b), client.WithHTTPClient(&http.Client{Transport: bOpened}))
	sbA, err := ca.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := cb.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}

	// A's filter: its sandbox and 255 more ids, the most one stream takes.
	ids := []string{sbA.ID}
	for i := len(ids); i < 256; i++ {
		ids = append(ids, fmt.Sprintf("sb%06d", i))
	}
	bigFilter := "?" + url.Values{"sandbox": {strings.Join(ids, ",")}}.Encode()
	open := func(tok, query string) *http.Response {
		t.Helper()
		sctx, scancel := context.WithCancel(ctx)
		req, err := http.NewRequestWithContext(sctx, "GET", ts.URL+"/v1/events"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			scancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { scancel(); resp.Body.Close() })
		return resp
	}
	refused := func(what string, resp *http.Response, status int, typ, detail string) {
		t.Helper()
		var p apitype.Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		if resp.StatusCode != status || p.Type != typ || !strings.Contains(p.Detail, detail) {
			t.Errorf("%s: %d %+v, want %d %s saying %q", what, resp.StatusCode, p, status, typ, detail)
		}
		if status == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After", what)
		}
	}
	// the shipped caps: 8 per token, 16 per owner
	for i := range 8 {
		if resp := open(a1, bigFilter); resp.StatusCode != http.StatusOK {
			t.Fatalf("A's stream %d on its first token: %d", i+1, resp.StatusCode)
		}
	}
	refused("A's ninth stream on one token", open(a1, bigFilter), http.StatusTooManyRequests, "too-many-requests", `token "a1"`)
	for i := range 8 {
		if resp := open(a2, bigFilter); resp.StatusCode != http.StatusOK {
			t.Fatalf("A's stream %d on its second token: %d", i+1, resp.StatusCode)
		}
	}
	refused("A's seventeenth stream, on a third token", open(a3, bigFilter), http.StatusTooManyRequests, "too-many-requests", `owner "tenant-a"`)
	all := make([]string, 7000)
	for i := range all {
		all[i] = fmt.Sprintf("sb%06d", i)
	}
	refused("A's 7000-id filter", open(a3, "?sandbox="+strings.Join(all, ",")), http.StatusBadRequest, "invalid-request", "256")
	if n := quotaRefusalsOf(t, reg, "pve_inspect_api_quota_refusals_total", "tenant-a", "event-streams"); n != 2 {
		t.Errorf("A's refusals counted %v, want 2", n)
	}

	// B, beside A's sixteen streams: a stream of its own, which carries its
	// sandbox's deletion and nothing of A's.
	var (
		mu  sync.Mutex
		got []apitype.Event
	)
	errStop := errors.New("deleted seen")
	done := make(chan error, 1)
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer bcancel()
	go func() {
		done <- cb.Events(bctx, client.EventsRequest{}, func(ev apitype.Event) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, ev)
			if ev.Type == apitype.EventDeleted && ev.Sandbox == sbB.ID {
				return errStop
			}
			return nil
		})
	}()
	// the stream starts with the next event once it was answered
	select {
	case <-bOpened.Opened:
	case err := <-done:
		t.Fatalf("B's stream ended before it was answered: %v", err)
	}
	if err := ca.Delete(ctx, sbA.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cb.Delete(ctx, sbB.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, errStop) {
		t.Fatalf("B's stream: %v (events %+v)", err, got)
	}
	t.Logf("B's delete and its event on B's stream: %s", time.Since(start))
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range got {
		if ev.Sandbox != sbB.ID || ev.Owner != "tenant-b" {
			t.Errorf("B's stream carried %+v", ev)
		}
	}
}

// quotaRefusalsOf returns the value of name{owner,quota} in reg (0 when
// absent).
func quotaRefusalsOf(t *testing.T, reg *prometheus.Registry, name, owner, quota string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			if have["owner"] == owner && have["quota"] == quota {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
