package sandbox_test

import (
	"context"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// targetChecker records the check's target and, when asked, re-applies
// the sandbox's egress as the keep-alive row does.
type targetChecker struct {
	reapply bool
	got     sandbox.CheckTarget
	err     error
}

func (c *targetChecker) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	c.got = t
	if c.reapply && t.ReapplyEgress != nil {
		c.err = t.ReapplyEgress(ctx)
	}
	return apitype.CheckReport{Pass: true}, nil
}

// countingEgress counts the policy sets of fakeEgress.
type countingEgress struct {
	*fakeEgress
	sets int
}

func (c *countingEgress) Set(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	c.sets++
	return c.fakeEgress.Set(ctx, sb, zone, bridges, p)
}

// TestCheckReappliesEgress: with egress policies on, the check's target
// can re-apply the sandbox's policy in force, unchanged (the containment
// check's keep-alive row); without them it cannot.
func TestCheckReappliesEgress(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		egress bool
	}{{"egress on", true}, {"egress off", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ch := &targetChecker{reapply: true}
			eg := &countingEgress{fakeEgress: &fakeEgress{policy: map[string]apitype.EgressPolicy{}}}
			b := newPoolBed(t, nil, func(o *sandbox.Options) {
				o.Checker = ch
				o.Egress = nil
				if tc.egress {
					o.Egress = eg
				}
			})
			req := oneVM("debian")
			if tc.egress {
				req.Egress = &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{"example.test"}}
			}
			sb, err := b.e.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.egress {
				// the policy in force now differs from the create's: the
				// check re-applies what is in force
				if _, err := b.e.SetEgress(ctx, sb, apitype.EgressPolicy{Mode: "allowlist", Allow: []string{"other.test"}}); err != nil {
					t.Fatal(err)
				}
			}
			before := eg.sets
			if _, err := b.e.Check(ctx, sb, sb.VMs[0]); err != nil {
				t.Fatal(err)
			}
			if !tc.egress {
				if ch.got.ReapplyEgress != nil {
					t.Error("a check target without egress policies can re-apply one")
				}
				return
			}
			if ch.err != nil {
				t.Fatalf("re-apply: %v", ch.err)
			}
			if eg.sets-before != 1 {
				t.Errorf("the check set the policy %d times, want once", eg.sets-before)
			}
			if p := eg.policy[sb.ID]; p.Mode != "allowlist" || len(p.Allow) != 1 || p.Allow[0] != "other.test" {
				t.Errorf("policy after the check %+v, want the one in force (allowlist other.test)", p)
			}
		})
	}
}
