package portmap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// Guard is what the mapper drives: the layer-2 guard's port map
// (*firewall.Guard).
type Guard interface {
	SetPorts(ctx context.Context, ports []firewall.Port) error
}

// DefaultInterval is how often a Mapper rereads the node's files.
const DefaultInterval = 2 * time.Second

// Mapper keeps the guard's port map current from the node's files.
type Mapper struct {
	Paths    Paths
	Guard    Guard
	Interval time.Duration // 0: DefaultInterval
	Log      *slog.Logger  // nil: discard
}

// Run maps once, then every Interval, until ctx is done (it then returns
// nil). A failed read keeps the last map in force (ports it never mapped
// stay DHCP-only) and is logged when it changes, except a missing VM
// config directory (ErrNoVMConfigs), which is read again quietly until it
// appears; problems with single lines are logged when they change.
func (m *Mapper) Run(ctx context.Context) error {
	log := m.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "portmap")
	every := m.Interval
	if every <= 0 {
		every = DefaultInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var lastProblems, lastErr string
	for {
		problems, err := m.Once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if s := errString(err); s != lastErr {
			switch {
			case errors.Is(err, ErrNoVMConfigs):
				log.Debug("no VM configs yet; waiting for them", "err", err)
			case err != nil:
				log.Error("cannot map guest ports; unmapped ports stay DHCP-only", "err", err)
			}
			lastErr = s
		}
		if s := strings.Join(problems, "; "); s != lastProblems && s != "" {
			log.Warn("skipped lines while mapping guest ports", "problems", s)
			lastProblems = s
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Once reads the VM configs and every zone's mappings and leases and sets
// the port map of every NIC of the node: the guard guards only the ports
// of its zone bridges, so a zone learned later finds its ports mapped.
func (m *Mapper) Once(ctx context.Context) ([]string, error) {
	vms, problems, err := m.Paths.ReadVMs()
	if err != nil {
		return problems, err
	}
	leases, pr, err := m.Paths.ReadAllZones()
	problems = append(problems, pr...)
	if err != nil {
		return problems, err
	}
	if err := m.Guard.SetPorts(ctx, Ports(vms, leases, time.Now(), nil)); err != nil {
		return problems, fmt.Errorf("set ports: %w", err)
	}
	return problems, nil
}

// ReadAllZones reads the mappings and leases of every zone that has a
// dnsmasq configuration directory or a lease file.
func (p Paths) ReadAllZones() ([]Lease, []string, error) {
	zones := map[string]bool{}
	ents, err := os.ReadDir(p.path("etc", "dnsmasq.d"))
	if err != nil && !os.IsNotExist(err) {
		return nil, nil, fmt.Errorf("read zones: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() && zoneRE.MatchString(e.Name()) {
			zones[e.Name()] = true
		}
	}
	files, err := filepath.Glob(p.path("var", "lib", "misc", "dnsmasq.*.leases"))
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		z := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "dnsmasq."), ".leases")
		if zoneRE.MatchString(z) {
			zones[z] = true
		}
	}
	var out []Lease
	var problems []string
	ids := make([]string, 0, len(zones))
	for z := range zones {
		ids = append(ids, z)
	}
	slices.Sort(ids)
	for _, z := range ids {
		ls, pr, err := p.ReadZone(z)
		if err != nil {
			return nil, problems, err
		}
		out = append(out, ls...)
		problems = append(problems, pr...)
	}
	return out, problems, nil
}
