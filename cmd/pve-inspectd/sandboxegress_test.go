package main

import (
	"bufio"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// handingEgress is an egress part that keeps a record of three DNS
// questions per sandbox and hands it over at a delete
// (sandbox.EgressTaker).
type handingEgress struct{}

func (handingEgress) Validate(apitype.EgressPolicy) error { return nil }
func (handingEgress) Set(context.Context, string, string, []string, apitype.EgressPolicy) error {
	return nil
}
func (handingEgress) Remove(context.Context, string, string) error { return nil }
func (handingEgress) Status(sb, _ string) apitype.EgressStatus {
	return apitype.EgressStatus{Sandbox: sb, Policy: apitype.EgressPolicy{Mode: "open"}}
}
func (handingEgress) Log(sb string, _ sandbox.EgressLogFilter) apitype.EgressLog {
	return apitype.EgressLog{Sandbox: sb}
}
func (handingEgress) TakeLog(string) sandbox.EgressHandover { return threeQuestions{} }

// threeQuestions is a handed-over record: three questions, 2 dropped.
type threeQuestions struct{}

func (threeQuestions) Len() int        { return 3 }
func (threeQuestions) Dropped() uint64 { return 2 }
func (threeQuestions) Next() uint64    { return 5 }
func (threeQuestions) Each(fn func(apitype.EgressRecord) error) error {
	for seq := uint64(3); seq <= 5; seq++ {
		if err := fn(apitype.EgressRecord{Seq: seq, Type: "dns", Verdict: "answered", Name: "example.org", QType: "A", Answers: []string{"192.0.2.1"}}); err != nil {
			return err
		}
	}
	return nil
}
func (threeQuestions) Release() {}

// TestSandboxDeleteEgressLog: `sandbox delete ID --egress-log` deletes
// the sandbox and prints its whole egress record as `sandbox egress-log`
// prints a page, or one JSON record a line with --json; a node keeping
// no record, a sandbox already gone and more than one sandbox are errors.
func TestSandboxDeleteEgressLog(t *testing.T) {
	cases := []struct {
		name    string
		egress  bool
		args    []string // after "sandbox delete --socket SOCK"; ID is the sandbox's id
		gone    bool
		wantOut *regexp.Regexp
		ndjson  int // NDJSON lines wanted
		wantErr string
		deleted bool
	}{
		{name: "table", egress: true, args: []string{"ID", "--egress-log"}, deleted: true,
			wantOut: regexp.MustCompile(`(?s)SEQ\s+TIME.*\n3\s.*example.org A\s+192.0.2.1.*\n5\s.*\n3 records, 2 dropped by the bounds\n$`)},
		{name: "ndjson", egress: true, args: []string{"ID", "--egress-log", "--json"}, ndjson: 3, deleted: true},
		{name: "node keeps no record", args: []string{"ID", "--egress-log"}, wantErr: "unavailable"},
		{name: "gone", egress: true, gone: true, args: []string{"ID", "--egress-log"}, wantErr: "not-found", deleted: true},
		{name: "two sandboxes", egress: true, args: []string{"ID", "ID", "--egress-log"}, wantErr: "one sandbox at a time"},
		{name: "--json alone", egress: true, args: []string{"ID", "--json"}, wantErr: "--json goes with --egress-log"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock, eng, _ := startAPIWith(t, true, func(o *sandbox.Options) {
				if tc.egress {
					o.Egress = handingEgress{}
				}
			})
			sb, err := eng.Create(context.Background(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.gone {
				if err := eng.Delete(context.Background(), sb.ID); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"sandbox", "delete", "--socket", sock}
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "ID", sb.ID))
			}
			out, err := run(t, "", args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("err %v, want one saying %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if tc.wantOut != nil && !tc.wantOut.MatchString(out) {
				t.Errorf("output:\n%s", out)
			}
			if tc.ndjson > 0 {
				n := 0
				sc := bufio.NewScanner(strings.NewReader(out))
				for sc.Scan() {
					var r apitype.EgressRecord
					if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Seq != uint64(3+n) || r.Name != "example.org" {
						t.Errorf("line %q: %+v %v", sc.Text(), r, err)
					}
					n++
				}
				if n != tc.ndjson {
					t.Errorf("%d lines, want %d:\n%s", n, tc.ndjson, out)
				}
			}
			if _, ok := eng.Get(sb.ID); ok == tc.deleted {
				t.Errorf("sandbox there %v, want deleted %v", ok, tc.deleted)
			}
		})
	}
}
