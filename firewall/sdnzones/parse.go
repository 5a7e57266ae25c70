package sdnzones

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
)

// MaxSize is the largest running config Read accepts. A node's applied
// SDN config is a few KiB per zone; anything larger is not one.
const MaxSize = 8 << 20

// idPattern is pve-network's format of zone and vnet ids
// (pve-sdn-zone-id, pve-sdn-vnet-id): 2-8 characters.
var idPattern = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]$`)

// Snapshot is what one read of the running config yields.
type Snapshot struct {
	// Version is pve-network's counter of applies (0: never applied).
	Version int64
	// Zones maps each zone id to its vnets (bridge names), sorted. Zones
	// without vnets are left out.
	Zones map[string][]string
	// Skipped names vnets left isolated, with the reason (no zone, or a
	// zone the file does not define), as pve-network skips them too.
	Skipped []string
}

// ParseError is a running config that cannot be used; the caller keeps
// its last good zones.
type ParseError struct {
	Err error
}

func (e *ParseError) Error() string { return "parse sdn running config: " + e.Err.Error() }
func (e *ParseError) Unwrap() error { return e.Err }

// runningConfig holds the keys the guard reads. Keys are matched exactly,
// as pve-network's Perl hashes do (encoding/json's struct decoding would
// also take "Zones" or "ZONE").
type runningConfig struct {
	Version json.RawMessage
	Zones   map[string]json.RawMessage // zone id -> entry; nil when absent
	VNets   map[string]json.RawMessage // vnet id -> entry; nil when absent
}

// decodeRunningConfig splits the document into its exact top-level keys.
func decodeRunningConfig(top map[string]json.RawMessage) (runningConfig, error) {
	rc := runningConfig{Version: top["version"]}
	var err error
	if rc.Zones, err = idsOf(top, "zones"); err != nil {
		return rc, err
	}
	rc.VNets, err = idsOf(top, "vnets")
	return rc, err
}

// idsOf returns the "ids" object of top[key]: nil when absent or null.
func idsOf(top map[string]json.RawMessage, key string) (map[string]json.RawMessage, error) {
	raw, ok := top[key]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var sec map[string]json.RawMessage
	if err := json.Unmarshal(raw, &sec); err != nil {
		return nil, fmt.Errorf("%s: not an object: %w", key, err)
	}
	ids, ok := sec["ids"]
	if !ok || string(ids) == "null" {
		return nil, nil
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(ids, &out); err != nil {
		return nil, fmt.Errorf("%s.ids: not an object: %w", key, err)
	}
	return out, nil
}

// stringField returns entry[key] when it is a JSON string; ok is false
// when the key is absent or null.
func stringField(entry map[string]json.RawMessage, key string) (v string, ok bool, err error) {
	raw, has := entry[key]
	if !has || string(raw) == "null" {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false, fmt.Errorf("%s: not a string", key)
	}
	return v, true, nil
}

// Parse reads a running config document. Empty input (only white space)
// is a node where SDN was never applied: an empty Snapshot. Any other
// document must be one JSON object whose zone and vnet ids have
// pve-network's format; otherwise the error is a *ParseError.
func Parse(data []byte) (Snapshot, error) {
	if len(data) > MaxSize {
		return Snapshot{}, &ParseError{Err: fmt.Errorf("%d bytes, more than %d", len(data), MaxSize)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Snapshot{Zones: map[string][]string{}}, nil
	}
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&top); err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	if top == nil {
		return Snapshot{}, &ParseError{Err: errors.New("not a JSON object")}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Snapshot{}, &ParseError{Err: errors.New("data after the JSON object")}
	}
	rc, err := decodeRunningConfig(top)
	if err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	s, err := rc.snapshot()
	if err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	return s, nil
}

func (rc runningConfig) snapshot() (Snapshot, error) {
	var s Snapshot
	v, err := parseVersion(rc.Version)
	if err != nil {
		return Snapshot{}, err
	}
	s.Version = v
	zones := map[string]bool{}
	for id, raw := range rc.Zones {
		if !idPattern.MatchString(id) || len(id) > 8 {
			return Snapshot{}, fmt.Errorf("zone id %q is not a pve-network zone id", id)
		}
		if !isObject(raw) {
			return Snapshot{}, fmt.Errorf("zone %s: not an object", id)
		}
		zones[id] = true
	}
	s.Zones = map[string][]string{}
	for id, raw := range rc.VNets {
		zone, err := vnetZone(id, raw)
		if err != nil {
			return Snapshot{}, err
		}
		switch {
		case zone == "":
			s.Skipped = append(s.Skipped, id+": no zone")
		case !zones[zone]:
			s.Skipped = append(s.Skipped, id+": zone "+zone+" is not defined")
		default:
			s.Zones[zone] = append(s.Zones[zone], id)
		}
	}
	for _, v := range s.Zones {
		sort.Strings(v)
	}
	sort.Strings(s.Skipped)
	return s, nil
}

// vnetZone checks one vnet entry and returns its zone ("" when none).
func vnetZone(id string, raw json.RawMessage) (string, error) {
	if !idPattern.MatchString(id) || len(id) > 8 {
		return "", fmt.Errorf("vnet id %q is not a pve-network vnet id", id)
	}
	var e map[string]json.RawMessage
	if !isObject(raw) || json.Unmarshal(raw, &e) != nil {
		return "", fmt.Errorf("vnet %s: not an object", id)
	}
	typ, has, err := stringField(e, "type")
	if err != nil {
		return "", fmt.Errorf("vnet %s: %w", id, err)
	}
	if has && typ != "vnet" {
		return "", fmt.Errorf("vnet %s: type %q, want \"vnet\"", id, typ)
	}
	zone, _, err := stringField(e, "zone")
	if err != nil {
		return "", fmt.Errorf("vnet %s: %w", id, err)
	}
	if zone != "" && (!idPattern.MatchString(zone) || len(zone) > 8) {
		return "", fmt.Errorf("vnet %s: zone %q is not a pve-network zone id", id, zone)
	}
	return zone, nil
}

// parseVersion accepts an absent version, a non-negative integer, or one
// written as a string of digits.
func parseVersion(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	txt := string(raw)
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &txt); err != nil {
			return 0, fmt.Errorf("version: %w", err)
		}
	}
	v, err := strconv.ParseInt(txt, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("version %s is not a non-negative integer", raw)
	}
	return v, nil
}

func isObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{'
}

// Equal reports whether two zone maps hold the same zones and vnets.
func Equal(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

// Union joins zone maps: a zone id in several maps is one zone with the
// vnets of all of them. The result's vnet lists are sorted and unique.
func Union(maps ...map[string][]string) map[string][]string {
	out := map[string][]string{}
	for _, m := range maps {
		for id, vnets := range m {
			for _, v := range vnets {
				if !slices.Contains(out[id], v) {
					out[id] = append(out[id], v)
				}
			}
		}
	}
	for id := range out {
		slices.Sort(out[id])
	}
	return out
}
