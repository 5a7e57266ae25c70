// Package egresstest holds doubles for the tests of packages that wire
// an egress.Registry whose kernel side is not under test.
package egresstest

import (
	"context"
	"net/netip"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// NopGuard is an egress.Guard whose every change is in force at once:
// every interface is a guest's, of no zone; nothing is learned or
// refused.
type NopGuard struct{}

// SetEgress implements egress.Guard.
func (NopGuard) SetEgress(context.Context, map[string]firewall.ZoneEgress) error { return nil }

// EgressOf implements egress.Guard: every interface is a guest's.
func (NopGuard) EgressOf(string) (firewall.ZoneEgress, bool) { return firewall.ZoneEgress{}, true }

// LearnOpen implements egress.Guard: nothing skipped.
func (NopGuard) LearnOpen(context.Context, string, []netip.Addr, firewall.Opening, time.Duration) ([]netip.Addr, error) {
	return nil, nil
}

// Forget implements egress.Guard.
func (NopGuard) Forget(context.Context, []string) error { return nil }

// ForgetExcept implements egress.Guard.
func (NopGuard) ForgetExcept(context.Context, []string) error { return nil }

// LearnedElements implements egress.Guard: none.
func (NopGuard) LearnedElements(context.Context) ([]firewall.LearnedElement, error) {
	return nil, nil
}

// ZoneOfBridge implements egress.Guard: no zone.
func (NopGuard) ZoneOfBridge(string) (string, bool) { return "", false }
