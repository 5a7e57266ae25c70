package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestDeleteKeepingEgress: the client asks for the record
// (egress_log=true, the media type of the method), reads it as JSON or
// NDJSON with the X-Egress-* headers, returns a refusal as its problem,
// and a 204 (a daemon that predates egress_log: deleted, no record) as
// ErrNoEgressHandover.
func TestDeleteKeepingEgress(t *testing.T) {
	cases := []struct {
		name    string
		stream  bool
		status  int
		body    string
		want    apitype.EgressLog
		records int
		wantErr func(error) bool
	}{
		{name: "json", status: 200, body: `{"sandbox":"sb1","records":[{"seq":4,"type":"dns","verdict":"answered"}],"dropped":3,"next":4,"more":false}`,
			want: apitype.EgressLog{Sandbox: "sb1", Dropped: 3, Next: 4}, records: 1},
		{name: "ndjson", stream: true, status: 200, body: "{\"seq\":4,\"type\":\"dns\",\"verdict\":\"answered\"}\n{\"seq\":5,\"type\":\"conn\",\"verdict\":\"allowed\"}\n",
			want: apitype.EgressLog{Sandbox: "sb1", Dropped: 3, Next: 5}, records: 2},
		{name: "gone", status: 404, body: `{"type":"not-found","status":404}`,
			wantErr: func(err error) bool { return client.IsProblem(err, apitype.ProblemNotFound) }},
		{name: "an older daemon", status: 204,
			wantErr: func(err error) bool { return errors.Is(err, client.ErrNoEgressHandover) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				wantAccept := "application/json"
				if tc.stream {
					wantAccept = "application/x-ndjson"
				}
				if r.Method != "DELETE" || r.URL.Path != "/v1/sandboxes/sb1" || r.URL.Query().Get("egress_log") != "true" || r.Header.Get("Accept") != wantAccept {
					t.Errorf("request %s %s Accept %q", r.Method, r.URL, r.Header.Get("Accept"))
				}
				switch {
				case tc.status >= 400:
					w.Header().Set("Content-Type", "application/problem+json")
				case tc.stream:
					w.Header().Set("Content-Type", "application/x-ndjson")
					w.Header().Set("X-Egress-Dropped", "3")
					w.Header().Set("X-Egress-Next", "5")
				default:
					w.Header().Set("Content-Type", "application/json")
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			c := client.New(srv.URL)
			var got apitype.EgressLog
			var err error
			n := 0
			if tc.stream {
				got, err = c.DeleteKeepingEgressStream(context.Background(), "sb1", func(apitype.EgressRecord) error { n++; return nil })
			} else {
				got, err = c.DeleteKeepingEgress(context.Background(), "sb1")
				n = len(got.Records)
				got.Records = nil
			}
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Errorf("err %v", err)
				}
				return
			}
			if err != nil || n != tc.records || got.Sandbox != tc.want.Sandbox || got.Dropped != tc.want.Dropped || got.Next != tc.want.Next || got.More {
				t.Errorf("got %+v (%d records) %v, want %+v (%d records)", got, n, err, tc.want, tc.records)
			}
		})
	}
}
