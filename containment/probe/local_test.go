package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestMain lets the test binary be the nesting row's child, as the probe
// program is (KindNesting runs /proc/self/exe -nested-proc DIR).
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == nestedProcFlag {
		os.Exit(NestedProc(os.Args[2], os.Stdout))
	}
	os.Exit(m.Run())
}

// wantErr fails t unless err is nil (want "") or says want.
func wantErr(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want an error with %q", err, want)
	}
}

// localRequest is one target of each local kind.
func localRequest() *Request {
	req := &Request{Version: Version}
	for _, k := range LocalKinds {
		t := Target{ID: string(k), Kind: k}
		switch k {
		case KindProcSys:
			t.Paths = []string{"/proc/sys/kernel/core_pattern", "/proc/sys/no/such/knob"}
		case KindSysfs:
			t.Paths = []string{"/sys/power/state"}
		}
		req.Targets = append(req.Targets, t)
	}
	return req
}

// TestValidateLocalTargets: a local target takes only an id, its kind, a
// timeout and, for the two that open files, paths under their tree; a
// request holds one of each kind.
func TestValidateLocalTargets(t *testing.T) {
	with := func(kind Kind, mod func(*Target)) *Request {
		req := localRequest()
		for i := range req.Targets {
			if req.Targets[i].Kind == kind {
				mod(&req.Targets[i])
			}
		}
		return req
	}
	for _, c := range []struct {
		name string
		req  *Request
		err  string // "" = valid
	}{
		{"one of each", localRequest(), ""},
		{"with a timeout", with(KindNesting, func(t *Target) { t.TimeoutMS = 5000 }), ""},
		{"an address", with(KindModule, func(t *Target) { t.Addr = "10.0.0.1:1" }), "takes only"},
		{"a name", with(KindIDMap, func(t *Target) { t.Name = "x.test" }), "takes only"},
		{"paths on a kind without", with(KindMount, func(t *Target) { t.Paths = []string{"/proc/sys/x"} }), "no paths"},
		{"no paths", with(KindProcSys, func(t *Target) { t.Paths = nil }), "paths"},
		{"too many paths", with(KindSysfs, func(t *Target) { t.Paths = strings.Split(strings.Repeat("/sys/a ", maxPaths+1), " ")[:maxPaths+1] }), "paths"},
		{"outside /proc", with(KindProcSys, func(t *Target) { t.Paths = []string{"/etc/shadow"} }), "under /proc/"},
		{"sysfs outside /sys", with(KindSysfs, func(t *Target) { t.Paths = []string{"/proc/sys/kernel/printk"} }), "under /sys/"},
		{"not clean", with(KindProcSys, func(t *Target) { t.Paths = []string{"/proc/sys/../../etc/shadow"} }), "clean"},
		{"a space", with(KindSysfs, func(t *Target) { t.Paths = []string{"/sys/a b"} }), "clean"},
		{"long", with(KindSysfs, func(t *Target) { t.Paths = []string{"/sys/" + strings.Repeat("a", maxOpLen)} }), "at most"},
		{"two of a kind", &Request{Version: Version, Targets: []Target{{ID: "a", Kind: KindKeyring}, {ID: "b", Kind: KindKeyring}}}, "second"},
	} {
		t.Run(c.name, func(t *testing.T) { wantErr(t, ValidateRequest(c.req), c.err) })
	}
}

// TestParseLocalResults: calls and id maps come only with a tried
// result, bounded and strict.
func TestParseLocalResults(t *testing.T) {
	rep := func(r Result) []byte {
		r.ID = "x"
		return mustJSON(t, Report{Version: Version, Facts: Facts{Interfaces: []Interface{}, Resolvers: []string{}}, Results: []Result{r}})
	}
	calls := func(n int) []Call {
		var out []Call
		for range n {
			out = append(out, Call{Op: "open /proc/sys/kernel/printk for writing", Errno: "EACCES"})
		}
		return out
	}
	for _, c := range []struct {
		name string
		data []byte
		err  string
	}{
		{"calls", rep(Result{Outcome: OutcomeTried, Calls: []Call{{Op: "keyctl", Errno: "ENOSYS"}, {Op: "mount"}}}), ""},
		{"id map", rep(Result{Outcome: OutcomeTried, IDMap: []IDExtent{{Type: "uid", Outside: 100000, Count: 65536}, {Type: "gid", Outside: 100000, Count: 65536}}}), ""},
		{"calls on another outcome", rep(Result{Outcome: OutcomeTimeout, Calls: calls(1)}), "calls"},
		{"id map on an error", rep(Result{Outcome: OutcomeError, IDMap: []IDExtent{{Type: "uid", Count: 1}}}), "id map"},
		{"tried with nothing", rep(Result{Outcome: OutcomeTried}), "without"},
		{"too many calls", rep(Result{Outcome: OutcomeTried, Calls: calls(maxCalls + 1)}), "calls"},
		{"errno not a name", rep(Result{Outcome: OutcomeTried, Calls: []Call{{Op: "x", Errno: "permission denied"}}}), "errno"},
		{"empty op", rep(Result{Outcome: OutcomeTried, Calls: []Call{{Errno: "EPERM"}}}), "op"},
		{"long op", rep(Result{Outcome: OutcomeTried, Calls: []Call{{Op: strings.Repeat("a", maxOpLen+1)}}}), "op"},
		{"control in op", rep(Result{Outcome: OutcomeTried, Calls: []Call{{Op: "a\u202eb"}}}), "op"},
		{"id map type", rep(Result{Outcome: OutcomeTried, IDMap: []IDExtent{{Type: "pid", Count: 1}}}), "type"},
		{"id map count 0", rep(Result{Outcome: OutcomeTried, IDMap: []IDExtent{{Type: "uid"}}}), "count 0"},
		{"unknown key in a call", []byte(`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[{"id":"x","outcome":"tried","elapsed_ms":0,"calls":[{"op":"a","errno":"EPERM","ret":1}]}]}`), "unknown key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseReport(c.data)
			wantErr(t, err, c.err)
		})
	}
}

// TestLocalKindsRun: the probe runs every local kind on the kernel the
// test runs on and reports each as tried, in a report the host's strict
// parser accepts: the calls are named, the answers errno names or
// success, the nesting child (this binary, TestMain) answers. What the
// kernel answers depends on who runs the test; the bed tests judge it.
func TestLocalKindsRun(t *testing.T) {
	req := localRequest()
	if err := ValidateRequest(req); err != nil {
		t.Fatal(err)
	}
	rep := (&Prober{}).Run(context.Background(), req)
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rep); err != nil {
		t.Fatal(err)
	}
	back, err := ParseReport(bytes.TrimSpace(buf.Bytes()))
	if err != nil {
		t.Fatalf("the host refuses the probe's report: %v\n%s", err, buf.String())
	}
	calls := map[Kind]int{KindProcSys: 2, KindSysfs: 1, KindMount: 2, KindKeyring: 2, KindModule: 3}
	for _, r := range back.Results {
		k := Kind(r.ID)
		if r.Outcome != OutcomeTried {
			t.Errorf("%s: %s (%s), want tried", k, r.Outcome, r.Detail)
			continue
		}
		switch k {
		case KindIDMap:
			if len(r.IDMap) < 2 {
				t.Errorf("id map %+v: want a uid and a gid line at least", r.IDMap)
			}
		case KindNesting:
			// the clone, and the mount when the clone succeeded
			if n := len(r.Calls); n < 1 || n > 2 || (n == 1) != (r.Calls[0].Errno != "") {
				t.Errorf("nesting calls %+v", r.Calls)
			}
		default:
			if len(r.Calls) != calls[k] {
				t.Errorf("%s: calls %+v, want %d", k, r.Calls, calls[k])
			}
		}
		t.Logf("%s: %+v %+v", k, r.Calls, r.IDMap)
	}
	for _, r := range back.Results {
		if r.ID == string(KindProcSys) && r.Calls[1].Errno != "ENOENT" {
			t.Errorf("a knob that does not exist: %+v, want ENOENT", r.Calls[1])
		}
	}
}
