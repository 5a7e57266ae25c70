package sdnzones

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
)

// The parser before the single-pass one, kept as the oracle of
// FuzzParseMatchesReference: every value decoded with encoding/json into
// maps of raw messages, each level scanned again.

// refIDPattern is pve-network's id format as a regular expression.
var refIDPattern = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]$`)

// refConfig holds the keys the guard reads. Keys are matched exactly,
// as pve-network's Perl hashes do (encoding/json's struct decoding would
// also take "Zones" or "ZONE").
type refConfig struct {
	Version json.RawMessage
	Zones   map[string]json.RawMessage // zone id -> entry; nil when absent
	VNets   map[string]json.RawMessage // vnet id -> entry; nil when absent
}

// refDecode splits the document into its exact top-level keys.
func refDecode(top map[string]json.RawMessage) (refConfig, error) {
	rc := refConfig{Version: top["version"]}
	var err error
	if rc.Zones, err = refIDsOf(top, "zones"); err != nil {
		return rc, err
	}
	rc.VNets, err = refIDsOf(top, "vnets")
	return rc, err
}

// refIDsOf returns the "ids" object of top[key]: nil when absent or null.
func refIDsOf(top map[string]json.RawMessage, key string) (map[string]json.RawMessage, error) {
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

// refStringField returns entry[key] when it is a JSON string; ok is false
// when the key is absent or null.
func refStringField(entry map[string]json.RawMessage, key string) (v string, ok bool, err error) {
	raw, has := entry[key]
	if !has || string(raw) == "null" {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false, fmt.Errorf("%s: not a string", key)
	}
	return v, true, nil
}

// parseReference is Parse as it was: empty input (only white space)
// is a node where SDN was never applied: an empty Snapshot. Any other
// document must be one JSON object whose zone and vnet ids have
// pve-network's format; otherwise the error is a *ParseError.
func parseReference(data []byte) (Snapshot, error) {
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
	rc, err := refDecode(top)
	if err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	s, err := rc.snapshot()
	if err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	return s, nil
}

func (rc refConfig) snapshot() (Snapshot, error) {
	var s Snapshot
	v, err := parseVersion(rc.Version)
	if err != nil {
		return Snapshot{}, err
	}
	s.Version = v
	zones := map[string]bool{}
	for id, raw := range rc.Zones {
		if !refIDPattern.MatchString(id) || len(id) > 8 {
			return Snapshot{}, fmt.Errorf("zone id %q is not a pve-network zone id", id)
		}
		if !refIsObject(raw) {
			return Snapshot{}, fmt.Errorf("zone %s: not an object", id)
		}
		zones[id] = true
	}
	s.Zones = map[string][]string{}
	for id, raw := range rc.VNets {
		zone, err := refVnetZone(id, raw)
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

// refVnetZone checks one vnet entry and returns its zone ("" when none).
func refVnetZone(id string, raw json.RawMessage) (string, error) {
	if !refIDPattern.MatchString(id) || len(id) > 8 {
		return "", fmt.Errorf("vnet id %q is not a pve-network vnet id", id)
	}
	var e map[string]json.RawMessage
	if !refIsObject(raw) || json.Unmarshal(raw, &e) != nil {
		return "", fmt.Errorf("vnet %s: not an object", id)
	}
	typ, has, err := refStringField(e, "type")
	if err != nil {
		return "", fmt.Errorf("vnet %s: %w", id, err)
	}
	if has && typ != "vnet" {
		return "", fmt.Errorf("vnet %s: type %q, want \"vnet\"", id, typ)
	}
	zone, _, err := refStringField(e, "zone")
	if err != nil {
		return "", fmt.Errorf("vnet %s: %w", id, err)
	}
	if zone != "" && (!refIDPattern.MatchString(zone) || len(zone) > 8) {
		return "", fmt.Errorf("vnet %s: zone %q is not a pve-network zone id", id, zone)
	}
	return zone, nil
}

func refIsObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{'
}
