package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// stateVersion is the version of the persisted policies file.
const stateVersion = 1

// stateFile is the on-disk form of the zones' policies, versioned apart
// from the API types.
type stateFile struct {
	Version int          `json:"version"`
	Zones   []stateEntry `json:"zones"`
	// Default is the node-wide default in force when the file was
	// written (absent in files of older runs): a start with another
	// default forgets what the old one learned (Registry.Reconcile).
	Default *Policy `json:"default,omitempty"`
}

type stateEntry struct {
	Zone    string   `json:"zone"`
	Owner   string   `json:"owner"`
	Bridges []string `json:"bridges"`
	Policy  Policy   `json:"policy"`
}

// State is the persisted policies, loaded before the guard starts so that
// it adopts its table with them in force (firewall.WithEgress).
type State struct {
	path  string
	zones map[string]zoneEntry
	def   *Policy // the default the file recorded, nil if none
}

// LoadState reads the policies persisted at path; a missing file is an
// empty state. A file that does not parse, or holds a policy that does
// not compile, is an error naming it (nothing is guessed).
func LoadState(path string) (*State, error) {
	st := &State{path: path, zones: map[string]zoneEntry{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("egress state: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("egress state %s: %w", path, err)
	}
	if f.Version != stateVersion {
		return nil, fmt.Errorf("egress state %s: version %d, want %d", path, f.Version, stateVersion)
	}
	for _, e := range f.Zones {
		r, err := Compile(e.Policy)
		if err != nil {
			return nil, fmt.Errorf("egress state %s: zone %s: %w", path, e.Zone, err)
		}
		st.zones[e.Zone] = zoneEntry{owner: e.Owner, bridges: e.Bridges, rules: r}
	}
	if f.Default != nil {
		r, err := Compile(*f.Default)
		if err != nil {
			return nil, fmt.Errorf("egress state %s: default: %w", path, err)
		}
		p := r.Policy()
		st.def = &p
	}
	return st, nil
}

// Zones returns the kernel side of the persisted policies.
func (s *State) Zones() map[string]firewall.ZoneEgress {
	return kernelZones(s.zones)
}

func kernelZones(zones map[string]zoneEntry) map[string]firewall.ZoneEgress {
	m := make(map[string]firewall.ZoneEgress, len(zones))
	for id, e := range zones {
		z := e.rules.Zone()
		z.Bridges = e.bridges
		m[id] = z
	}
	return m
}

// save writes zones and the default in force to the state file
// atomically (atomicfile).
func (s *State) save(zones map[string]zoneEntry, def Rules) error {
	if s == nil || s.path == "" {
		return nil
	}
	dp := def.Policy()
	f := stateFile{Version: stateVersion, Zones: []stateEntry{}, Default: &dp}
	for id, e := range zones {
		f.Zones = append(f.Zones, stateEntry{Zone: id, Owner: e.owner, Bridges: e.bridges, Policy: e.rules.Policy()})
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("save egress state: %w", err)
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save egress state: %w", err)
	}
	if err := atomicfile.Write(s.path, b, 0o600); err != nil {
		return fmt.Errorf("save egress state: %w", err)
	}
	s.def = &dp
	return nil
}

// Entry is one persisted zone policy.
type Entry struct {
	Zone    string
	Owner   string
	Bridges []string
	Policy  Policy
}

// Entries returns the persisted zone policies, sorted by zone.
func (s *State) Entries() []Entry {
	var out []Entry
	for _, id := range slices.Sorted(maps.Keys(s.zones)) {
		e := s.zones[id]
		out = append(out, Entry{Zone: id, Owner: e.owner, Bridges: slices.Clone(e.bridges), Policy: e.rules.Policy()})
	}
	return out
}
