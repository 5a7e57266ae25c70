package containment

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

func TestKeepAliveRow(t *testing.T) {
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), ExternalName: "x1.example.test", LocalName: "local.zone",
		Egress: &EgressSpec{AllowedName: "example.test", DeniedName: "other.example.test", KeepAlive: true}}
	plan, err := NewPlan(spec, WithEgress(GuardPolicy(), "allowlist"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []Check
	for _, c := range plan.Checks {
		if c.Target.Kind == probe.KindKeepAlive {
			rows = append(rows, c)
		}
	}
	if len(rows) != 1 || !plan.keepAlive() {
		t.Fatalf("%d keep-alive rows, want 1", len(rows))
	}
	c := rows[0]
	if c.Group != GroupEgress || c.Expect != Blocked || c.Control || c.Target.Name != "example.test" || c.Target.Addr != "0.0.0.0:443" ||
		c.Target.Resolver != "10.10.1.1:53" || c.Target.Signal != "" {
		t.Errorf("keep-alive row %+v", c)
	}
	req := plan.request(0, "/tmp/p.signal")
	for _, tg := range req.Targets {
		if (tg.Signal != "") != (tg.Kind == probe.KindKeepAlive) {
			t.Errorf("target %s (%s) has signal %q", tg.ID, tg.Kind, tg.Signal)
		}
	}
	for _, tc := range []struct {
		r    probe.Result
		want Verdict
	}{
		{probe.Result{Outcome: probe.OutcomeOpen, Detail: "second request on the old connection: EOF"}, Blocked},
		{probe.Result{Outcome: probe.OutcomeResponse, HTTPStatus: 200}, Reachable},
		{probe.Result{Outcome: probe.OutcomeError, Detail: "first request: EOF"}, Errored},
	} {
		if v, d := observe(c, tc.r); v != tc.want {
			t.Errorf("%+v observed %s (%s), want %s", tc.r, v, d, tc.want)
		}
	}
	leak := evaluate(&Plan{Checks: []Check{c}}, &probe.Report{Results: []probe.Result{{ID: c.Target.ID, Outcome: probe.OutcomeResponse, HTTPStatus: 200}}}, nil)
	if w := leak.Rows[len(leak.Rows)-1].Why; !strings.Contains(w, "old egress policy") {
		t.Errorf("a surviving old connection explained as %q", w)
	}
	spec.Egress.KeepAlive = false
	plan, err = NewPlan(spec, WithEgress(GuardPolicy(), "allowlist"))
	if err != nil || plan.keepAlive() {
		t.Errorf("without KeepAlive: keep-alive row %v, %v", plan.keepAlive(), err)
	}
}

// streamGuest runs no probe: its ExecStream writes the given stderr
// chunks and records what the runner did in between.
type streamGuest struct {
	chunks []string
	files  []string
	events []string
}

func (g *streamGuest) WriteFile(_ context.Context, path string, _ io.Reader, _ fs.FileMode) error {
	g.files = append(g.files, path)
	g.events = append(g.events, "write "+path[strings.LastIndexByte(path, '.')+1:])
	return nil
}

func (g *streamGuest) Exec(context.Context, []string, []byte, time.Duration) ([]byte, []byte, int, error) {
	return nil, nil, 0, errors.New("not streamed")
}

func (g *streamGuest) ExecStream(_ context.Context, _ []string, _ []byte, _ time.Duration, w io.Writer) ([]byte, int, error) {
	for _, c := range g.chunks {
		g.events = append(g.events, "chunk")
		if _, err := w.Write([]byte(c)); err != nil {
			return nil, 0, err
		}
	}
	return []byte("not a report"), 0, nil
}

// TestRunnerKeepAlive: the runner changes the policy once the ready line
// came (even split over chunks), then writes the signal; without Change
// or a streaming guest it refuses the plan.
func TestRunnerKeepAlive(t *testing.T) {
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), ExternalName: "x1.example.test", LocalName: "local.zone",
		ControlPorts: []Port{}, Metadata: []netip.Addr{}, MetadataDNS: []netip.Addr{}, UDPPorts: []Port{}, PeerUDPPorts: []Port{},
		Egress: &EgressSpec{AllowedName: "example.test", DeniedName: "other.example.test", KeepAlive: true}}
	plan, err := NewPlan(spec, WithEgress(GuardPolicy(), "allowlist"))
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, c := range plan.Checks {
		if c.Target.Kind == probe.KindKeepAlive {
			id = c.Target.ID
		}
	}
	line := probe.ReadyPrefix + id + "\n"
	bin := t.TempDir() + "/probe"
	if err := os.WriteFile(bin, []byte("not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	g := &streamGuest{chunks: []string{"noise\n" + line[:10], line[10:], "after\n"}}
	r := &Runner{ProbePath: bin, Change: func(context.Context) error { g.events = append(g.events, "change"); return nil }}
	if _, err := r.Run(context.Background(), g, plan); err == nil || !errors.Is(err, ErrProbe) {
		t.Errorf("run: %v, want the probe's report refused", err)
	}
	// the request (.json), the probe (its random name), then the run
	want := "write json|write probe|chunk|chunk|change|write signal|chunk"
	got := strings.Join(g.events, "|")
	if len(g.files) == 3 {
		got = strings.Replace(got, "write "+g.files[1][strings.LastIndexByte(g.files[1], '.')+1:], "write probe", 1)
	}
	if got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	if len(g.files) != 3 || g.files[0] != g.files[1]+".json" || g.files[2] != g.files[1]+".signal" {
		t.Errorf("files written %q, want the request, the probe and its .signal", g.files)
	}
	// a failed change is the run's error, and the signal still goes out
	g = &streamGuest{chunks: []string{line}}
	r.Change = func(context.Context) error { return errors.New("kernel says no") }
	if _, err := r.Run(context.Background(), g, plan); err == nil || !strings.Contains(err.Error(), "kernel says no") {
		t.Errorf("run with a failing change: %v", err)
	}
	if len(g.files) != 3 {
		t.Errorf("files written %q, want the request, the probe and the signal", g.files)
	}
	r.Change = nil
	if _, err := r.Run(context.Background(), &streamGuest{}, plan); err == nil || !strings.Contains(err.Error(), "Change") {
		t.Errorf("run without Change: %v", err)
	}
	r.Change = func(context.Context) error { return nil }
	if _, err := r.Run(context.Background(), plainGuest{}, plan); err == nil || !strings.Contains(err.Error(), "streams") {
		t.Errorf("run on a guest that does not stream: %v", err)
	}
}

// plainGuest is a Guest without ExecStream.
type plainGuest struct{}

func (plainGuest) WriteFile(context.Context, string, io.Reader, fs.FileMode) error { return nil }
func (plainGuest) Exec(context.Context, []string, []byte, time.Duration) ([]byte, []byte, int, error) {
	return nil, nil, 0, errors.New("unused")
}
