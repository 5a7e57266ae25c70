//go:build !linux

package l2observe

import (
	"context"
	"errors"

	"github.com/vishvananda/netns"
)

// Observer watches bridges; only Linux has them.
type Observer struct{}

// Option configures an Observer.
type Option func(*Observer)

// WithNetNS is accepted and ignored off Linux.
func WithNetNS(netns.NsHandle) Option { return func(*Observer) {} }

// New returns an Observer that cannot watch.
func New(...Option) *Observer { return &Observer{} }

// Observe fails: watching a bridge needs Linux.
func (o *Observer) Observe(context.Context, Query, func(context.Context) error) (Sightings, error) {
	return Sightings{}, errors.New("l2observe: needs Linux")
}
