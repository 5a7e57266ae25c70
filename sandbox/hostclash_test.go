package sandbox_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestHostClashNamedInTheLogOnly: a fixed cidr on one of the host's
// networks is refused (a conflict, in validate and create) without naming
// that network to the client; the node's log names it, with the
// request's owner, for the operator.
func TestHostClashNamedInTheLogOnly(t *testing.T) {
	var logs testkit.LogBuffer
	e := newEngine(t, func(o *sandbox.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.HostNetworks = func(context.Context) ([]netip.Prefix, error) {
			return []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}, nil
		}
	})
	req := oneVM("debian")
	req.Owner = "tenant-b"
	req.Networks[0].CIDR = "192.168.7.128/25"
	ctx := context.Background()
	refusals, _, err := e.Validate(ctx, req)
	if err != nil || len(refusals) != 1 {
		t.Fatalf("validate: %v %v, want one refusal", refusals, err)
	}
	_, cerr := e.Create(ctx, req)
	if !errors.Is(cerr, sandbox.ErrConflict) {
		t.Fatalf("create: %v, want a conflict", cerr)
	}
	for _, got := range []error{refusals[0], cerr} {
		if strings.Contains(got.Error(), "192.168.7.0/24") || !strings.Contains(got.Error(), "a network of the node's host") {
			t.Errorf("refusal %q names the host's network, or does not say what it overlaps", got)
		}
	}
	if n := strings.Count(logs.String(), "host_network=192.168.7.0/24"); n != 2 || !strings.Contains(logs.String(), "owner=tenant-b") {
		t.Errorf("the node's log names the host's network %d times (want 2, with the owner):\n%s", n, logs.String())
	}
}
