package sdnzones

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
)

// DefaultPath is where pve-network keeps the applied SDN config.
const DefaultPath = "/etc/pve/sdn/.running-config"

// Options configure a Watcher.
type Options struct {
	// Path of the running config (DefaultPath in production).
	Path string
	// Apply hands the zones learned from the file to the guard. An error
	// is logged and the same zones are tried again at the next poll.
	Apply func(ctx context.Context, zones map[string][]string) error
	// Exclude names interfaces that never join a zone from this source
	// (the operator's trusted interfaces), whatever the file says.
	Exclude []string
	// Poll is how often the file's size and modification time are
	// checked; zero means 3s.
	Poll time.Duration
	// Logger gets a line per change and per unusable file (discarded when nil).
	Logger *slog.Logger
	// Metrics, when set, records reads, errors and the zones in force.
	Metrics *Metrics
}

// Watcher keeps the guard's zones from Proxmox's running config current.
// Sync and Run must not be called concurrently; Kick and Zones may be
// called from any goroutine.
type Watcher struct {
	o     Options
	log   *slog.Logger
	kick  chan struct{}
	polls int // owned by the goroutine in Sync/Run

	// seen is the size, mtime and inode of the last file that was parsed
	// and applied; owned by the goroutine in Sync/Run.
	seen     fileStamp
	everSeen bool // the file existed at some read (owned like seen)
	// last is the content last parsed and applied (owned like seen): a
	// forced read of the same bytes is not parsed again, so a burst of
	// interface changes costs a read each, not a parse of every zone
	last []byte

	mu      sync.Mutex // guards applied
	applied map[string][]string
	pending bool // zones parsed but not applied yet (owned like seen)
}

type fileStamp struct {
	size  int64
	mtime time.Time
	ino   uint64
	ok    bool
}

// fullReadEvery forces a read every this many polls even when size and
// mtime look unchanged (pmxcfs keeps mtimes in whole seconds).
const fullReadEvery = 10

// New returns a watcher; nothing is read until Sync or Run.
func New(o Options) (*Watcher, error) {
	if o.Path == "" {
		return nil, errors.New("sdn zones: no path")
	}
	if o.Apply == nil {
		return nil, errors.New("sdn zones: no apply function")
	}
	if o.Poll <= 0 {
		o.Poll = 3 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{o: o, log: log.With("component", "sdn-zones", "path", o.Path), kick: make(chan struct{}, 1)}, nil
}

// Kick asks for a read now (a new interface appeared); it never blocks.
func (w *Watcher) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Zones returns the zones last applied from the file.
func (w *Watcher) Zones() map[string][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return clone(w.applied)
}

// Sync reads the file once and applies it when it changed. An unusable
// file keeps the last good zones and is returned as an error (a
// *ParseError when it does not parse).
func (w *Watcher) Sync(ctx context.Context) error {
	return w.read(ctx, true)
}

// Run polls the file until ctx is done and returns nil then. Errors are
// logged and counted, never fatal: the last good zones stay.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.o.Poll)
	defer t.Stop()
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
			force = true
		case <-t.C:
			w.polls++
			force = w.polls%fullReadEvery == 0
		}
		if err := w.read(ctx, force); err != nil && ctx.Err() == nil {
			w.log.Error("sdn running config not used, last good zones kept", "err", err)
		}
	}
}

// read stats the file and, when it changed (or force), parses and applies it.
func (w *Watcher) read(ctx context.Context, force bool) error {
	st, data, err := w.load()
	switch {
	case errors.Is(err, fs.ErrNotExist) && !w.everSeen:
		// Never applied on this node (pve-network reads it as {}).
		return w.apply(ctx, fileStamp{}, Snapshot{Zones: map[string][]string{}})
	case errors.Is(err, fs.ErrNotExist):
		// Seen before: /etc/pve is not mounted (pmxcfs restarting).
		w.o.Metrics.failed("missing")
		return fmt.Errorf("sdn zones: %s vanished after it was read: %w", w.o.Path, err)
	case err != nil:
		w.o.Metrics.failed("read")
		return fmt.Errorf("sdn zones: %w", err)
	}
	w.everSeen = true
	if !force && !w.pending && st == w.seen {
		return nil
	}
	if data == nil {
		if data, err = w.readAll(); err != nil {
			w.o.Metrics.failed("read")
			return fmt.Errorf("sdn zones: %w", err)
		}
	}
	if !w.pending && w.last != nil && bytes.Equal(data, w.last) {
		w.seen = st
		return nil
	}
	snap, err := Parse(data)
	if err != nil {
		w.o.Metrics.failed("parse")
		w.seen = st // do not re-parse the same garbled file on every poll
		return err
	}
	if err := w.apply(ctx, st, snap); err != nil {
		return err
	}
	w.last = data
	return nil
}

// load stats the file; data stays nil (read later, only when needed).
func (w *Watcher) load() (fileStamp, []byte, error) {
	fi, err := os.Stat(w.o.Path)
	if err != nil {
		return fileStamp{}, nil, err
	}
	if !fi.Mode().IsRegular() {
		return fileStamp{}, nil, fmt.Errorf("%s is not a regular file", w.o.Path)
	}
	return fileStamp{size: fi.Size(), mtime: fi.ModTime(), ino: inode(fi), ok: true}, nil, nil
}

func (w *Watcher) readAll() ([]byte, error) { return readLimited(w.o.Path) }

// readLimited reads at most MaxSize+1 bytes of path (Parse refuses more).
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// ReadFile reads and parses the running config at path once (for plans).
// An absent file is SDN never applied: an empty Snapshot.
func ReadFile(path string) (Snapshot, error) {
	data, err := readLimited(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Snapshot{Zones: map[string][]string{}}, nil
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("sdn zones: %w", err)
	}
	return Parse(data)
}

// apply filters the excluded names out and hands the zones to the guard
// when they differ from the ones applied last.
func (w *Watcher) apply(ctx context.Context, st fileStamp, snap Snapshot) error {
	zones := w.filter(snap.Zones)
	w.mu.Lock()
	same := Equal(w.applied, zones) // the guard starts without zones from here
	w.mu.Unlock()
	w.o.Metrics.parsed(snap.Version)
	if !same {
		if err := w.o.Apply(ctx, clone(zones)); err != nil {
			w.pending = true
			w.o.Metrics.failed("apply")
			return fmt.Errorf("sdn zones: apply: %w", err)
		}
		w.mu.Lock()
		w.applied = zones
		w.mu.Unlock()
		w.log.Info("zones from the sdn running config", "version", snap.Version, "zones", len(zones), "vnets", countVNets(zones), "skipped", snap.Skipped)
	}
	w.pending = false
	w.seen = st
	w.o.Metrics.inForce(len(zones))
	return nil
}

func (w *Watcher) filter(in map[string][]string) map[string][]string {
	out := make(map[string][]string, len(in))
	for z, vnets := range in {
		var keep []string
		for _, v := range vnets {
			if slices.Contains(w.o.Exclude, v) {
				w.log.Warn("vnet has the name of a trusted interface: left out of its zone", "zone", z, "vnet", v)
				continue
			}
			keep = append(keep, v)
		}
		if len(keep) > 0 {
			out[z] = keep
		}
	}
	return out
}

func clone(in map[string][]string) map[string][]string {
	if in == nil {
		return nil
	}
	out := make(map[string][]string, len(in))
	for k, v := range in {
		out[k] = slices.Clone(v)
	}
	return out
}

func countVNets(z map[string][]string) int {
	n := 0
	for _, v := range z {
		n += len(v)
	}
	return n
}
