package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

func TestPrintCheckDetails(t *testing.T) {
	pass := apitype.CheckRow{Target: "metadata", Probe: "http GET 169.254.169.254:80", Expected: "blocked", Observed: "blocked", Pass: true, Detail: "timed out"}
	fail := apitype.CheckRow{Target: "raw frame", Probe: "raw UDP to 10.0.0.1:9", Expected: "reachable", Observed: "error", Control: true,
		Detail: "the node could not watch its bridge: no such device"}
	for _, tc := range []struct {
		name     string
		rep      apitype.CheckReport
		want     []string
		wantNone []string
	}{
		{name: "all pass", rep: apitype.CheckReport{Sandbox: "s1", VM: "vm0", Pass: true, Rows: []apitype.CheckRow{pass}},
			want: []string{"all probes PASS"}, wantNone: []string{"timed out", "FAIL"}},
		{name: "a failed row says what it saw", rep: apitype.CheckReport{Sandbox: "s1", VM: "vm0", Rows: []apitype.CheckRow{pass, fail}},
			want:     []string{"raw frame (control)", "FAIL raw frame (raw UDP to 10.0.0.1:9): the node could not watch its bridge: no such device", "some probes FAIL"},
			wantNone: []string{"timed out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printCheck(&b, tc.rep)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.wantNone {
				if strings.Contains(b.String(), w) {
					t.Errorf("output has %q:\n%s", w, b.String())
				}
			}
		})
	}
}
