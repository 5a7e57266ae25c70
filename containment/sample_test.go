package containment

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// busySpec is the node of a busy host: the VM's zone, a management
// address (v4 and v6), the gateways of sandboxes other zones, guests per
// other sandbox, and LAN targets (two ports per address, as discovered).
func busySpec(sandboxes, guests, lan int) Spec {
	spec := goldenSpec()
	spec.HostAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")}
	spec.OtherZone, spec.LAN = nil, nil
	for i := range sandboxes {
		spec.OtherGateways = append(spec.OtherGateways, netip.AddrFrom4([4]byte{10, 200, byte(i), 1}))
		for g := range guests {
			spec.OtherZone = append(spec.OtherZone, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, byte(i), byte(10 + g)}), 22))
		}
	}
	for i := range lan {
		a := netip.AddrFrom4([4]byte{192, 168, 50, byte(1 + i/2)})
		spec.LAN = append(spec.LAN, netip.AddrPortFrom(a, []uint16{22, 80}[i%2]))
	}
	return spec
}

// rowKey names a check across plans (ids differ).
func rowKey(c Check) string { return string(c.Group) + "|" + c.Name + "|" + c.Target.Addr }

// TestSampledPlan: a plan for a node with many sandboxes fits the probe's
// bounds, always holds every row about the node's own addresses and the
// fixed checks, leaves out whole addresses only, says what it left out,
// and consecutive rotations cover every row.
func TestSampledPlan(t *testing.T) {
	cases := []struct {
		name                  string
		sandboxes, guests     int
		lan, budget           int
		wantSampled           bool
		wantMaxRows, wantRuns int
	}{
		{"50 sandboxes fit the default budget", 50, 1, 30, 0, false, DefaultBudget, 1},
		{"60 sandboxes, 2 guests each, 30 LAN targets: every row", 60, 2, 30, 0, false, DefaultBudget, 1},
		{"the same under a small budget", 60, 2, 30, 300, true, 300, 4},
		{"the same under a budget over the probe's bound", 60, 2, 30, 100_000, false, probe.MaxTargets, 1},
		{"200 sandboxes", 200, 2, 30, 0, true, DefaultBudget, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := busySpec(tc.sandboxes, tc.guests, tc.lan)
			full, err := fullChecks(spec)
			if err != nil {
				t.Fatal(err)
			}
			spec.Budget = tc.budget
			runs := 1
			covered := map[string]bool{}
			for rot := range uint64(8) {
				spec.Rotation = 1000 + rot
				p, err := NewPlan(spec, GuardPolicy())
				if err != nil {
					t.Fatalf("rotation %d: %v", rot, err)
				}
				if err := probe.ValidateRequest(p.request((&Runner{}).concurrency(len(p.Checks)), signalPlaceholder)); err != nil {
					t.Fatalf("rotation %d: %v", rot, err)
				}
				if tc.wantMaxRows > 0 && len(p.Checks) > tc.wantMaxRows {
					t.Errorf("rotation %d: %d rows, want at most %d", rot, len(p.Checks), tc.wantMaxRows)
				}
				if (p.Sampling != nil) != tc.wantSampled {
					t.Fatalf("rotation %d: sampling %+v, want sampled=%v (%d rows planned)", rot, p.Sampling, tc.wantSampled, len(full))
				}
				checkSample(t, full, p)
				for _, c := range p.Checks {
					covered[rowKey(c)] = true
				}
				if p.Sampling != nil {
					runs = p.Sampling.Runs
				}
			}
			t.Logf("%d rows planned, every row within %d runs", len(full), runs)
			if tc.wantRuns > 0 && runs != tc.wantRuns {
				t.Errorf("full coverage in %d runs, want %d", runs, tc.wantRuns)
			}
			if runs <= 8 {
				for _, c := range full {
					if !covered[rowKey(c)] {
						t.Errorf("row %q not covered by 8 consecutive rotations (every row within %d)", c.Name, runs)
					}
				}
			}
		})
	}
}

// fullChecks is the unsampled plan of spec (it may be over the probe's bound).
func fullChecks(spec Spec) ([]Check, error) {
	p, err := buildPlan(spec, GuardPolicy())
	if err != nil {
		return nil, err
	}
	return p.Checks, nil
}

// checkSample checks one sampled plan against the full one.
func checkSample(t *testing.T, full []Check, p *Plan) {
	t.Helper()
	kept := map[string]bool{}
	for _, c := range p.Checks {
		kept[rowKey(c)] = true
	}
	byAddr := map[string][2]int{} // sampled address: rows kept, rows in all
	left := 0
	for _, c := range full {
		if !c.sample.IsValid() {
			if !kept[rowKey(c)] {
				t.Errorf("always-probed row %q left out", c.Name)
			}
			continue
		}
		k := string(c.Group) + " " + c.sample.String()
		n := byAddr[k]
		n[1]++
		if kept[rowKey(c)] {
			n[0]++
		} else {
			left++
		}
		byAddr[k] = n
	}
	var leftOut []string
	for k, n := range byAddr {
		switch n[0] {
		case 0:
			leftOut = append(leftOut, k)
		case n[1]:
		default:
			t.Errorf("%s: %d of its %d rows kept, want all or none", k, n[0], n[1])
		}
	}
	s := p.Sampling
	if s == nil {
		if left > 0 {
			t.Errorf("%d rows left out without a Sampling", left)
		}
		return
	}
	if s.RowsLeftOut != left || len(s.LeftOut) != len(leftOut) || s.Addresses-s.Probed != len(leftOut) || s.Addresses != len(byAddr) {
		t.Errorf("sampling %d rows/%d addresses left out of %d, want %d rows/%d addresses of %d",
			s.RowsLeftOut, len(s.LeftOut), s.Addresses, left, len(leftOut), len(byAddr))
	}
	for _, k := range s.LeftOut {
		if n := byAddr[k]; n[0] != 0 {
			t.Errorf("%s listed as left out, but %d rows kept", k, n[0])
		}
	}
}

// TestSampledResult: rows a run left out are in no row of the result,
// passed or failed, and the text says how many there are.
func TestSampledResult(t *testing.T) {
	spec := busySpec(60, 2, 30)
	spec.Budget = 300
	p, err := NewPlan(spec, GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	rep := &probe.Report{Version: probe.Version, Facts: goodFacts}
	for _, c := range p.Checks {
		rep.Results = append(rep.Results, probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeTimeout})
	}
	res := Evaluate(p, rep)
	if len(res.Rows) != len(p.Checks)+1 || res.Sampling != p.Sampling {
		t.Fatalf("%d rows for %d checks, sampling %v", len(res.Rows), len(p.Checks), res.Sampling)
	}
	left := map[string]bool{}
	for _, k := range p.Sampling.LeftOut {
		left[strings.SplitN(k, " ", 2)[1]] = true
	}
	for _, r := range res.Rows {
		for a := range left {
			if strings.Contains(r.Target, " "+a+":") {
				t.Errorf("row %q aims at left-out %s", r.Name, a)
			}
		}
	}
	var buf bytes.Buffer
	if err := res.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("SAMPLED: %d rows", p.Sampling.RowsLeftOut)
	if !strings.Contains(buf.String(), want) || !strings.Contains(buf.String(), "the next run probes others") {
		t.Errorf("text lacks %q and the next run:\n%s", want, buf.String())
	}
}

// TestRunnerScales: the probe's concurrency and the exec timeout grow
// with the rows; the timeout covers every round of blocked rows.
func TestRunnerScales(t *testing.T) {
	cases := []struct {
		name       string
		base, rows int
		timeout    time.Duration
		udpAddrs   int
		wantConc   int
	}{
		{"small plan keeps the base", 16, 40, 0, 3, 16},
		{"small plan, base 4", 4, 20, 0, 3, 4},
		{"grows with the rows", 16, 300, 0, 30, 38},
		{"capped", 16, 2000, 0, 300, probe.MaxConcurrency},
		{"long per-probe timeout", 0, 1000, 10 * time.Second, 100, probe.MaxConcurrency},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &Runner{Concurrency: tc.base}
			req := &probe.Request{Version: probe.Version, Concurrency: r.concurrency(tc.rows)}
			if req.Concurrency != tc.wantConc {
				t.Errorf("concurrency %d, want %d", req.Concurrency, tc.wantConc)
			}
			for i := range tc.rows {
				tg := probe.Target{ID: fmt.Sprint("c", i), Kind: probe.KindTCP, Addr: "10.0.0.1:22", TimeoutMS: int(tc.timeout / time.Millisecond)}
				if i < tc.udpAddrs {
					tg.Kind, tg.Addr = probe.KindUDP, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 161).String()
				}
				req.Targets = append(req.Targets, tg)
			}
			per := tc.timeout
			if per == 0 {
				per = probe.DefaultTimeout * time.Millisecond
			}
			rounds := (tc.rows + req.Concurrency - 1) / req.Concurrency
			canaries := (tc.udpAddrs + probe.MaxConcurrency - 1) / probe.MaxConcurrency
			floor := time.Duration(rounds+canaries) * per
			got := r.execTimeout(req)
			if got < floor+execSlack || got > floor+execSlack+time.Duration(rounds)*time.Second {
				t.Errorf("exec timeout %v, want %v (%d rounds and %d canary rounds of %v) plus slack", got, floor, rounds, canaries, per)
			}
		})
	}
}
