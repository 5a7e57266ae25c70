package sdnzones

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
)

// MaxSize is the largest running config Read accepts. A node's applied
// SDN config is a few KiB per zone; anything larger is not one.
const MaxSize = 8 << 20

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

// maxDepth bounds the nesting of the document, as encoding/json does
// (its limit is the same), so a hostile depth cannot exhaust the stack.
const maxDepth = 10000

// validID reports whether s has pve-network's format of zone and vnet ids
// (pve-sdn-zone-id, pve-sdn-vnet-id: a letter, then letters or digits, 2-8
// characters).
func validID(s string) bool {
	if len(s) < 2 || len(s) > 8 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c|0x20 >= 'a' && c|0x20 <= 'z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Parse reads a running config document. Empty input (only white space)
// is a node where SDN was never applied: an empty Snapshot. Any other
// document must be one JSON object whose zone and vnet ids have
// pve-network's format; otherwise the error is a *ParseError.
//
// It reads the document in one pass, validating all of it as JSON and
// keeping only what the guard uses: the version, the zone ids, and each
// vnet's type and zone. Keys match exactly, as pve-network's Perl hashes
// do (encoding/json's struct decoding would also take "Zones" or "ZONE");
// a key given twice counts the last time, as with a JSON object decoded
// into a map.
func Parse(data []byte) (Snapshot, error) {
	if len(data) > MaxSize {
		return Snapshot{}, &ParseError{Err: fmt.Errorf("%d bytes, more than %d", len(data), MaxSize)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		// nothing but (Unicode) white space
		return Snapshot{Zones: map[string][]string{}}, nil
	}
	p := &parser{data: data}
	rc, err := p.document()
	if err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	s, err := rc.snapshot()
	if err != nil {
		return Snapshot{}, &ParseError{Err: err}
	}
	return s, nil
}

// runningConfig is what the guard reads of the document.
type runningConfig struct {
	version []byte          // the raw value: nil when absent
	zones   map[string]bool // zone id -> its entry is an object
	vnets   map[string]vnetEntry
}

// vnetEntry is one vnet of the document.
type vnetEntry struct {
	object bool  // the entry is a JSON object
	typ    field // "type"
	zone   field // "zone"
}

// field is a string member of a vnet entry.
type field struct {
	value  string // the string
	isStr  bool   // present as a string (null is absent)
	notStr bool   // present with a value neither a string nor null
}

func (rc runningConfig) snapshot() (Snapshot, error) {
	var s Snapshot
	v, err := parseVersion(rc.version)
	if err != nil {
		return Snapshot{}, err
	}
	s.Version = v
	for id, obj := range rc.zones {
		if !validID(id) {
			return Snapshot{}, fmt.Errorf("zone id %q is not a pve-network zone id", id)
		}
		if !obj {
			return Snapshot{}, fmt.Errorf("zone %s: not an object", id)
		}
	}
	s.Zones = map[string][]string{}
	for id, e := range rc.vnets {
		zone, err := e.check(id)
		if err != nil {
			return Snapshot{}, err
		}
		switch {
		case zone == "":
			s.Skipped = append(s.Skipped, id+": no zone")
		case !rc.zones[zone]:
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

// check validates vnet id's entry and returns its zone ("" when none).
func (e vnetEntry) check(id string) (string, error) {
	switch {
	case !validID(id):
		return "", fmt.Errorf("vnet id %q is not a pve-network vnet id", id)
	case !e.object:
		return "", fmt.Errorf("vnet %s: not an object", id)
	case e.typ.notStr:
		return "", fmt.Errorf("vnet %s: type: not a string", id)
	case e.zone.notStr:
		return "", fmt.Errorf("vnet %s: zone: not a string", id)
	case e.typ.isStr && e.typ.value != "vnet":
		return "", fmt.Errorf("vnet %s: type %q, want \"vnet\"", id, e.typ.value)
	case e.zone.value != "" && !validID(e.zone.value):
		return "", fmt.Errorf("vnet %s: zone %q is not a pve-network zone id", id, e.zone.value)
	}
	return e.zone.value, nil
}

// parseVersion accepts an absent version, a non-negative integer, or one
// written as a string of digits. raw is the value as written.
func parseVersion(raw []byte) (int64, error) {
	if raw == nil || string(raw) == "null" {
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

// parser reads one JSON document from data.
type parser struct {
	data  []byte
	pos   int
	depth int
}

// syntaxError is malformed JSON at the parser's position.
func (p *parser) syntaxError(what string) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", p.pos, what)
}

func (p *parser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// peek returns the next byte after white space (0 at the end).
func (p *parser) peek() byte {
	p.space()
	if p.pos == len(p.data) {
		return 0
	}
	return p.data[p.pos]
}

// document reads the top-level object and makes sure nothing follows it.
func (p *parser) document() (runningConfig, error) {
	var rc runningConfig
	if p.peek() != '{' {
		if err := p.skip(); err != nil {
			return rc, err
		}
		return rc, errors.New("not a JSON object")
	}
	err := p.object(func(key string) error {
		var err error
		switch key {
		case "version":
			start := p.pos
			if err = p.skip(); err == nil {
				rc.version = p.data[start:p.pos]
			}
		case "zones":
			rc.zones = nil
			err = p.section(key, func(id string) error {
				if rc.zones == nil {
					rc.zones = map[string]bool{}
				}
				rc.zones[id] = p.peek() == '{'
				return p.skip()
			})
		case "vnets":
			rc.vnets = nil
			err = p.section(key, func(id string) error {
				if rc.vnets == nil {
					rc.vnets = map[string]vnetEntry{}
				}
				e, err := p.vnet()
				rc.vnets[id] = e
				return err
			})
		default:
			err = p.skip()
		}
		return err
	})
	if err != nil {
		return rc, err
	}
	if p.space(); p.pos != len(p.data) {
		return rc, errors.New("data after the JSON object")
	}
	return rc, nil
}

// section reads the value of top-level key (zones, vnets): null, or an
// object whose "ids" (null or an object) holds the entries, each passed
// to entry with the parser at its value.
func (p *parser) section(key string, entry func(id string) error) error {
	if p.peek() != '{' {
		return p.nullOr(key + ": not an object")
	}
	return p.object(func(k string) error {
		if k != "ids" {
			return p.skip()
		}
		if p.peek() != '{' {
			return p.nullOr(key + ".ids: not an object")
		}
		return p.object(entry)
	})
}

// nullOr reads a value that must be null (otherwise the error is msg,
// once the value is known to be valid JSON).
func (p *parser) nullOr(msg string) error {
	start := p.pos
	if err := p.skip(); err != nil {
		return err
	}
	if string(p.data[start:p.pos]) != "null" {
		return errors.New(msg)
	}
	return nil
}

// vnet reads one vnet entry: its type and zone.
func (p *parser) vnet() (vnetEntry, error) {
	var e vnetEntry
	if p.peek() != '{' {
		return e, p.skip()
	}
	e.object = true
	err := p.object(func(key string) error {
		var f *field
		switch key {
		case "type":
			f = &e.typ
		case "zone":
			f = &e.zone
		default:
			return p.skip()
		}
		v, isString, err := p.stringOrNull()
		// a key given again replaces what it said before
		*f = field{isStr: isString, notStr: !isString && v != "null"}
		if isString {
			f.value = v
		}
		return err
	})
	return e, err
}

// stringOrNull reads a value: a string's content (isString), "null" for
// null, and for anything else its text with isString false.
func (p *parser) stringOrNull() (v string, isString bool, err error) {
	if p.peek() == '"' {
		s, err := p.str()
		return s, true, err
	}
	start := p.pos
	if err := p.skip(); err != nil {
		return "", false, err
	}
	return string(p.data[start:p.pos]), false, nil
}

// object reads an object, calling member for each key with the parser at
// the key's value; member must consume the value.
func (p *parser) object(member func(key string) error) error {
	if p.depth++; p.depth > maxDepth {
		return p.syntaxError("nested too deeply")
	}
	defer func() { p.depth-- }()
	p.pos++ // '{'
	if p.peek() == '}' {
		p.pos++
		return nil
	}
	for {
		if p.peek() != '"' {
			return p.syntaxError("want a string key")
		}
		key, err := p.str()
		if err != nil {
			return err
		}
		if p.peek() != ':' {
			return p.syntaxError("want ':'")
		}
		p.pos++
		p.space()
		if err := member(key); err != nil {
			return err
		}
		switch p.peek() {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return nil
		default:
			return p.syntaxError("want ',' or '}'")
		}
	}
}

// str reads a string at the parser's position and returns its content.
// Plain ASCII without escapes is taken as is; anything else is decoded by
// encoding/json (escapes, and invalid UTF-8 replaced as it does).
func (p *parser) str() (string, error) {
	start := p.pos
	p.pos++ // '"'
	plain := true
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			raw := p.data[start:p.pos]
			if plain {
				return string(raw[1 : len(raw)-1]), nil
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", fmt.Errorf("invalid JSON string at offset %d: %w", start, err)
			}
			return s, nil
		case c == '\\':
			plain = false
			p.pos++
			if p.pos == len(p.data) {
				return "", p.syntaxError("unterminated string")
			}
			switch p.data[p.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.pos++
			case 'u':
				if p.pos+5 > len(p.data) {
					return "", p.syntaxError("short \\u escape")
				}
				for _, h := range p.data[p.pos+1 : p.pos+5] {
					if !isHex(h) {
						return "", p.syntaxError("bad \\u escape")
					}
				}
				p.pos += 5
			default:
				return "", p.syntaxError("bad escape")
			}
		case c < 0x20:
			return "", p.syntaxError("control character in string")
		default:
			if c >= 0x80 {
				plain = false
			}
			p.pos++
		}
	}
	return "", p.syntaxError("unterminated string")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f'
}

// skip reads and discards one value, validating it.
func (p *parser) skip() error {
	switch c := p.peek(); {
	case c == '{':
		return p.object(func(string) error { return p.skip() })
	case c == '[':
		return p.array()
	case c == '"':
		_, err := p.str()
		return err
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case p.pos == len(p.data):
		return p.syntaxError("unexpected end of input")
	default:
		return p.syntaxError(fmt.Sprintf("unexpected %q", c))
	}
}

func (p *parser) array() error {
	if p.depth++; p.depth > maxDepth {
		return p.syntaxError("nested too deeply")
	}
	defer func() { p.depth-- }()
	p.pos++ // '['
	if p.peek() == ']' {
		p.pos++
		return nil
	}
	for {
		if err := p.skip(); err != nil {
			return err
		}
		switch p.peek() {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return nil
		default:
			return p.syntaxError("want ',' or ']'")
		}
	}
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.syntaxError("bad literal")
	}
	p.pos += len(word)
	return nil
}

// number reads a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() error {
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	at := func(c byte) bool { return p.pos < len(p.data) && p.data[p.pos] == c }
	if at('-') {
		p.pos++
	}
	switch {
	case at('0'):
		p.pos++
	case digits() == 0:
		return p.syntaxError("bad number")
	}
	if at('.') {
		p.pos++
		if digits() == 0 {
			return p.syntaxError("bad number")
		}
	}
	if at('e') || at('E') {
		p.pos++
		if at('+') || at('-') {
			p.pos++
		}
		if digits() == 0 {
			return p.syntaxError("bad number")
		}
	}
	return nil
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
