package provision

import (
	"context"
	"io"
	"log/slog"
)

// Env is what a step works with.
type Env struct {
	Config  Config
	Root    Root
	Runner  Runner
	Addrs   AddrSource
	Fetcher Fetcher
	State   *State
	Log     *slog.Logger
	// Random is the source of generated secrets (crypto/rand.Reader).
	Random io.Reader
	// IdentityArgv runs `pve-bootstrap node identity` with this recipe's
	// configuration (the identity boot unit's command).
	IdentityArgv []string
}

// Step is one unit of the recipe.
type Step struct {
	// ID is stable: it names the step in state.json, skip lists and output.
	ID string
	// Description says what the step makes true.
	Description string
	// Reboot is set when a reboot must follow the apply.
	Reboot bool
	// Check reports whether the step is already done. It must not change
	// anything. A nil Check means "done once recorded in state".
	Check func(ctx context.Context, e *Env) (bool, error)
	// After names the earlier step that installs the tools Check runs
	// (pvesh comes with proxmox-ve). A plan on a machine without them
	// says "after <step>: will apply" instead of failing.
	After string
	// Apply makes the step true.
	Apply func(ctx context.Context, e *Env) error
}
