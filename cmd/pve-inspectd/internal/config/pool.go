package config

import (
	"fmt"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// PoolSection configures the warm pool of ready sandboxes ([pool]): per
// shape, whole sandboxes built ahead so that a matching create claims one
// instead of building it (sandbox/pool.go).
type PoolSection struct {
	// Interval is how often the pool checks its members (age, template,
	// VM running and agent answering) and refills; a claim also wakes it.
	Interval time.Duration `toml:"interval"`
	// Shapes are the shapes kept warm ([[pool.shapes]]); none: no pool.
	Shapes []PoolShape `toml:"shapes"`
}

// PoolShape is one shape of the warm pool ([[pool.shapes]]).
type PoolShape struct {
	// Name names the shape in metrics and `sandbox list --pool`.
	Name string `toml:"name"`
	// Kind is the member's kind: "vm" (default) or "lxc" (an
	// unprivileged container; needs [api] containers = true, and a
	// container template as Template).
	Kind string `toml:"kind"`
	// Template, Cores and MemoryMiB are the member's (defaults 1 core,
	// 1024 MiB: the API's create defaults, so a plain create matches).
	Template  string `toml:"template"`
	Cores     int    `toml:"cores"`
	MemoryMiB int    `toml:"memory_mib"`
	// Networks are the member's network names, each an "auto" range with
	// DHCP and SNAT on (default ["net0"]).
	Networks []string `toml:"networks"`
	// Egress is the policy kind a matching create asks for: open (no
	// egress object, the default), none or allowlist.
	Egress string `toml:"egress"`
	// Target is how many members to keep ready.
	Target int `toml:"target"`
	// MaxAge retires a member this long after it became ready (0: never).
	MaxAge time.Duration `toml:"max_age"`
}

// defaultPool returns the [pool] defaults: no shapes.
func defaultPool() PoolSection {
	return PoolSection{Interval: 10 * time.Second, Shapes: []PoolShape{}}
}

// EngineShapes returns the shapes as the engine takes them, defaults
// filled in.
func (p PoolSection) EngineShapes() ([]sandbox.PoolShape, error) {
	out := make([]sandbox.PoolShape, len(p.Shapes))
	for i, s := range p.Shapes {
		out[i] = sandbox.PoolShape(s)
	}
	return sandbox.ValidateShapes(out)
}

func (p PoolSection) validate(prefix string) error {
	if p.Interval < time.Second {
		return &KeyError{Key: prefix + ".interval", Err: fmt.Errorf("%s: want at least 1s", p.Interval)}
	}
	for i, s := range p.Shapes {
		if !reTemplateName.MatchString(s.Template) {
			return &KeyError{Key: fmt.Sprintf("%s.shapes[%d].template", prefix, i), Err: fmt.Errorf("template %q: want a template name", s.Template)}
		}
	}
	if _, err := p.EngineShapes(); err != nil {
		return &KeyError{Key: prefix + ".shapes", Err: err}
	}
	return nil
}

// checkKinds refuses a shape of kind lxc on a node whose [api] does not
// make containers (containers): its members could never be built.
func (p PoolSection) checkKinds(prefix string, containers bool) error {
	for i, s := range p.Shapes {
		if s.Kind == apitype.KindLXC && !containers {
			return &KeyError{Key: fmt.Sprintf("%s.shapes[%d].kind", prefix, i),
				Err: fmt.Errorf("shape %q is of kind lxc, but [api] containers is off: turn containers on (README: Containers) or give the shape a VM template", s.Name)}
		}
	}
	return nil
}
