package qga

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The tagged exec passes guest-exec an explicit environment, and qemu-ga
// hands that list to g_spawn_async_with_pipes as the child's whole envp:
// it is not merged with the agent's own (qga/commands.c, qmp_guest_exec).
// So that the command sees what a bare guest-exec would give it, the base
// is the agent's own environment, read once per socket with one bare
// guest-exec of `env -0` and cached here. qemu-ga spawns with
// G_SPAWN_SEARCH_PATH_FROM_ENVP, so the program is looked up in the PATH
// of the list we pass, which is the agent's own PATH again.

const (
	// envTagName names the entry that marks every process of one tagged
	// exec; its value is a fresh random 32-hex-digit tag per exec.
	envTagName = "PVE_INSPECT_EXEC"
	// envProgram prints its environment NUL-separated (coreutils, -0).
	envProgram = "/usr/bin/env"
	// maxAgentEnvBytes and maxAgentEnvVars bound the agent's environment:
	// it travels with every tagged exec; a larger one takes the setsid path.
	maxAgentEnvBytes = 64 << 10
	maxAgentEnvVars  = 1024
	// agentEnvTTL is how long a captured environment is used before it is
	// read again (an agent restarted with another environment is seen
	// within this long).
	agentEnvTTL = time.Minute
)

// errAgentEnv marks an agent environment that cannot be used: the capture
// ran but its output is not a strict list of KEY=VALUE entries within the
// bounds, the agent's reply was malformed, or the agent could not run env.
var errAgentEnv = errors.New("agent environment unusable")

// parseAgentEnv parses the output of `env -0`: NUL-terminated KEY=VALUE
// entries, each with a non-empty name, valid UTF-8 (JSON carries it back),
// within maxAgentEnvBytes and maxAgentEnvVars. Entries named envTagName
// are dropped (every exec sets its own). The output is guest data and
// treated as hostile.
func parseAgentEnv(b []byte) ([]string, error) {
	if len(b) > maxAgentEnvBytes {
		return nil, fmt.Errorf("%w: %d bytes, over %d", errAgentEnv, len(b), maxAgentEnvBytes)
	}
	if len(b) == 0 {
		return []string{}, nil
	}
	if b[len(b)-1] != 0 {
		return nil, fmt.Errorf("%w: last entry not NUL-terminated", errAgentEnv)
	}
	n := bytes.Count(b, []byte{0})
	if n > maxAgentEnvVars {
		return nil, fmt.Errorf("%w: %d entries, over %d", errAgentEnv, n, maxAgentEnvVars)
	}
	env := make([]string, 0, n)
	for i, e := range strings.Split(string(b[:len(b)-1]), "\x00") {
		name, _, ok := strings.Cut(e, "=")
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("%w: entry %d is not NAME=VALUE", errAgentEnv, i)
		case !utf8.ValidString(e):
			return nil, fmt.Errorf("%w: entry %d is not valid UTF-8", errAgentEnv, i)
		case name == envTagName:
			continue
		}
		env = append(env, e)
	}
	return env, nil
}

// envCache holds the captured agent environment per socket path. An entry
// is never removed: one per VM socket the client talked to, a few KiB each.
type envCache struct {
	mu sync.Mutex // guards m
	m  map[string]*envEntry
}

// envEntry is one socket's captured environment.
type envEntry struct {
	// fill is a one-slot lock held while capturing, so that one capture
	// runs at a time per socket; waiters give up with their context.
	fill chan struct{}
	snap atomic.Pointer[envSnap]
}

// envSnap is one capture's outcome; immutable once stored.
type envSnap struct {
	env []string // nil: unusable (the setsid path is taken until expiry)
	at  time.Time
}

func (c *envCache) entry(socket string) *envEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*envEntry{}
	}
	e := c.m[socket]
	if e == nil {
		e = &envEntry{fill: make(chan struct{}, 1)}
		c.m[socket] = e
	}
	return e
}

// fresh returns the snapshot when it is younger than agentEnvTTL.
func (e *envEntry) fresh() *envSnap {
	if s := e.snap.Load(); s != nil && time.Since(s.at) < agentEnvTTL {
		return s
	}
	return nil
}

// agentEnv returns the environment qemu-ga gives its children (without
// any envTagName entry), capturing it when the cached one is missing or
// expired. It returns nil and no error when the agent's environment is
// unusable (no env program, malformed or oversized output): the caller
// takes the setsid path. An error means the channel failed or ctx ended;
// nothing is cached then.
func (a *Agent) agentEnv(ctx context.Context) ([]string, error) {
	e := a.c.envs.entry(a.socket)
	if s := e.fresh(); s != nil {
		return s.env, nil
	}
	select {
	case e.fill <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-e.fill }()
	if s := e.fresh(); s != nil {
		return s.env, nil // another caller captured it meanwhile
	}
	env, err := a.captureEnv(ctx)
	if err != nil && !errors.Is(err, errAgentEnv) {
		return nil, err
	}
	e.snap.Store(&envSnap{env: env, at: time.Now()})
	return env, nil
}

// captureEnv runs `env -0` bare (no env, capture-output) and parses it.
func (a *Agent) captureEnv(ctx context.Context) ([]string, error) {
	r, err := a.run(ctx, []string{envProgram, "-0"})
	var ae *AgentError
	var pe *ProtocolError
	switch {
	case errors.As(err, &ae), errors.As(err, &pe) && pe.Kind == KindMalformed:
		return nil, fmt.Errorf("%w: %w", errAgentEnv, err)
	case err != nil:
		return nil, fmt.Errorf("qga: read the agent's environment: %w", err)
	case r.ExitCode != 0:
		return nil, fmt.Errorf("%w: %s: %w", errAgentEnv, envProgram, r.err())
	}
	return parseAgentEnv(r.Stdout)
}

// taggedEnv is base plus the entry envTagName=tag.
func taggedEnv(base []string, tag string) []string {
	env := make([]string, len(base), len(base)+1)
	copy(env, base)
	return append(env, envTagName+"="+tag)
}
