package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// newEngine builds an engine on the in-memory fakes and reconciles it.
func newEngine(t *testing.T, mod func(*sandbox.Options)) *sandbox.Engine {
	t.Helper()
	g := apitest.NewGuests()
	o := sandbox.Options{Node: "node1", Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), Guests: g.Dial,
		StateDir: t.TempDir(), AgentTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&o)
	}
	e, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

func oneVM(template string) apitype.CreateRequest {
	return apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "vm0", Template: template, Cores: 1, MemoryMiB: 512, Networks: []string{"net0"}}},
		Networks: []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}, TTLSeconds: 60}
}

// TestEngineErrors: the engine refuses with its sentinels and typed
// errors (what sandboxapi maps to problems), never with problem documents,
// and each refusal's message says what was refused.
func TestEngineErrors(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, func(o *sandbox.Options) { o.Caps = sandbox.Caps{SandboxVCPUs: 1} })
	sb, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	big := oneVM("debian")
	big.VMs[0].Cores = 2
	clash := oneVM("debian")
	clash.Networks[0].CIDR = sb.Networks[0].CIDR
	_, _, _, _, errBegin := e.Begin(ctx, "sbnone00", "")
	_, _, _, _, errNoVM := e.Begin(ctx, sb.ID, "vm9")
	_, errExtend := e.Extend("sbnone00", time.Minute)
	_, errTemplate := e.Create(ctx, oneVM("nosuch"))
	_, errCap := e.Create(ctx, big)
	_, errClash := e.Create(ctx, clash)
	_, errCheck := e.Check(ctx, sb, sb.VMs[0])
	_, errEgress := e.EgressStatus(sb)
	errPolicy := e.ValidateEgress(&apitype.EgressPolicy{Mode: "none"})
	var (
		ce *sandbox.CapError
		ie *sandbox.InvalidError
		pe *apitype.Problem
	)
	for _, tc := range []struct {
		name string
		err  error
		is   func(error) bool
		msg  string
	}{
		{"begin on an unknown sandbox", errBegin, func(err error) bool { return errors.Is(err, sandbox.ErrUnknown) }, `sandbox "sbnone00" not found`},
		{"begin on an unknown VM", errNoVM, func(err error) bool { return errors.Is(err, sandbox.ErrUnknown) }, `has no VM "vm9"`},
		{"extend an unknown sandbox", errExtend, func(err error) bool { return errors.Is(err, sandbox.ErrUnknown) }, "not found"},
		{"unknown template", errTemplate, func(err error) bool { return errors.As(err, &ie) && ie.Field == "template" }, `unknown template "nosuch"`},
		{"over a cap", errCap, func(err error) bool {
			return errors.As(err, &ce) && ce.Cap == "sandbox_vcpus" && ce.Need == 2 && ce.Limit == 1
		}, "cap sandbox_vcpus: the create would need 2, the cap is 1"},
		{"a CIDR in use", errClash, func(err error) bool { return errors.Is(err, sandbox.ErrConflict) }, "overlaps a range in use"},
		{"no checker", errCheck, func(err error) bool { return errors.Is(err, sandbox.ErrNotConfigured) }, "the containment check is not configured"},
		{"no egress part", errEgress, func(err error) bool { return errors.Is(err, sandbox.ErrNotConfigured) }, "egress policies are not enabled"},
		{"a policy without an egress part", errPolicy, func(err error) bool { return errors.As(err, &ie) && ie.Field == "egress" }, "egress policies are not enabled"},
	} {
		if tc.err == nil || !tc.is(tc.err) || !strings.Contains(tc.err.Error(), tc.msg) {
			t.Errorf("%s: %v (%T), want a typed refusal saying %q", tc.name, tc.err, tc.err, tc.msg)
		}
		if errors.As(tc.err, &pe) {
			t.Errorf("%s: the engine returned a problem document %+v", tc.name, pe)
		}
	}
}

// TestEngineDeleteDuringOperation: an operation begun before a delete ends
// with a conflict saying why the sandbox went (deleted by whom, or expired
// when), a call begun while the delete waits for it is refused with the
// same why, and the delete waits for the operation.
func TestEngineDeleteDuringOperation(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		del    func(e *sandbox.Engine, clk *clock, id string) error
		reason string
		why    string
	}{
		{"delete call", func(e *sandbox.Engine, _ *clock, id string) error {
			return e.DeleteBy(ctx, id, `token "ci"`)
		}, apitype.ReasonDeleted, `it was deleted by token "ci"`},
		{"expiry", func(e *sandbox.Engine, clk *clock, id string) error {
			clk.add(2 * time.Minute)
			if n := e.Reap(ctx); n != 1 {
				return fmt.Errorf("reaped %d, want 1", n)
			}
			return nil
		}, apitype.ReasonExpired, "it expired at 2026-01-01T00:01:00Z (its TTL ran out and nothing extended it)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			e := newEngine(t, func(o *sandbox.Options) { o.Now = clk.now })
			sb, err := e.Create(ctx, oneVM("debian")) // TTL 60 s
			if err != nil {
				t.Fatal(err)
			}
			_, _, octx, end, err := e.Begin(ctx, sb.ID, "")
			if err != nil {
				t.Fatal(err)
			}
			deleted := make(chan error, 1)
			go func() { deleted <- tc.del(e, clk, sb.ID) }()
			select {
			case <-octx.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the delete did not cancel the operation")
			}
			_, _, _, _, errLate := e.Begin(ctx, sb.ID, "")
			select {
			case err := <-deleted:
				t.Fatalf("the delete finished before the operation ended: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
			for what, err := range map[string]error{"was deleted during the call": end(octx.Err()), "is being deleted": errLate} {
				var ge *sandbox.GoneError
				if !errors.As(err, &ge) || !errors.Is(err, sandbox.ErrConflict) || ge.Reason != tc.reason ||
					err.Error() != "sandbox "+sb.ID+" "+what+": "+tc.why {
					t.Errorf("%s: %v, want a conflict of reason %s saying %q", what, err, tc.reason, tc.why)
				}
			}
			if err := <-deleted; err != nil {
				t.Fatal(err)
			}
			if _, ok := e.Get(sb.ID); ok {
				t.Error("the sandbox is still known after the delete")
			}
		})
	}
}

// TestPrivateV4 pins the RFC 1918 rule that "auto" pools and explicit
// CIDRs follow.
func TestPrivateV4(t *testing.T) {
	for p, want := range map[string]bool{
		"10.200.0.0/16": true, "172.16.0.0/12": true, "172.31.255.0/24": true, "192.168.1.0/24": true,
		"172.32.0.0/16": false, "8.0.0.0/8": false, "10.0.0.0/7": false, "192.169.0.0/24": false,
	} {
		if got := sandbox.PrivateV4(netip.MustParsePrefix(p)); got != want {
			t.Errorf("PrivateV4(%s) = %v, want %v", p, got, want)
		}
	}
}

// TestValidID: only the form newSandboxID makes is a sandbox id.
func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{"sbabc123": true, "sb000000": true, "sbABC123": false, "sbabc12": false, "xxabc123": false, "sbabc1234": false, "": false} {
		if got := sandbox.ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}
