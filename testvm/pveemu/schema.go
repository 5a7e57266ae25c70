package pveemu

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

//go:embed schema.json
var schemaJSON []byte

// Schema is the extract of the official Proxmox VE API schema the emulator
// serves (schema.json, generated from apidata.json by internal/schemagen).
type Schema struct {
	endpoints map[string]*Endpoint
}

// Endpoint is one method on one path template of the schema.
type Endpoint struct {
	Method string
	Path   string
	// Params is the object schema of all parameters, path ones included.
	Params *Prop
	// Perm is the permission description ("check" expression or "user").
	Perm       Permissions
	AllowToken bool
	Protected  bool
}

// Permissions is an endpoint's permission description, as in Proxmox's
// RESTHandler: either a user class ("all", "world") or a check expression.
type Permissions struct {
	User  string `json:"user"`
	Check []any  `json:"check"`
}

// Prop is a JSON schema node as PVE::JSONSchema understands it.
type Prop struct {
	Type                 any              `json:"type"`
	Optional             flexBool         `json:"optional"`
	Format               any              `json:"format"`
	Pattern              string           `json:"pattern"`
	MaxLength            *flexNum         `json:"maxLength"`
	MinLength            *flexNum         `json:"minLength"`
	Minimum              *flexNum         `json:"minimum"`
	Maximum              *flexNum         `json:"maximum"`
	Enum                 []any            `json:"enum"`
	Items                *Prop            `json:"items"`
	Properties           map[string]*Prop `json:"properties"`
	AdditionalProperties any              `json:"additionalProperties"`
	DefaultKey           flexBool         `json:"default_key"`
	Alias                string           `json:"alias"`
	KeyAlias             string           `json:"keyAlias"`
	Default              any              `json:"default"`
	Requires             any              `json:"requires"`

	re        *regexp.Regexp
	formatMap map[string]*Prop
}

type flexBool bool

func (b *flexBool) UnmarshalJSON(p []byte) error {
	s := strings.Trim(string(p), `"`)
	*b = flexBool(s == "1" || s == "true")
	return nil
}

type flexNum float64

func (n *flexNum) UnmarshalJSON(p []byte) error {
	s := strings.Trim(string(p), `"`)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("schema number %q: %w", s, err)
	}
	*n = flexNum(f)
	return nil
}

// LoadSchema parses the embedded schema extract.
func LoadSchema() (*Schema, error) {
	var doc struct {
		Endpoints map[string]struct {
			Parameters  *Prop       `json:"parameters"`
			Permissions Permissions `json:"permissions"`
			AllowToken  flexBool    `json:"allowtoken"`
			Protected   flexBool    `json:"protected"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(schemaJSON, &doc); err != nil {
		return nil, fmt.Errorf("parse schema.json: %w", err)
	}
	s := &Schema{endpoints: map[string]*Endpoint{}}
	for key, e := range doc.Endpoints {
		method, path, ok := strings.Cut(key, " ")
		if !ok {
			return nil, fmt.Errorf("schema.json: bad endpoint key %q", key)
		}
		params := e.Parameters
		if params == nil {
			params = &Prop{Type: "object"}
		}
		if err := params.compile(); err != nil {
			return nil, fmt.Errorf("schema %s: %w", key, err)
		}
		s.endpoints[key] = &Endpoint{Method: method, Path: path, Params: params, Perm: e.Permissions,
			AllowToken: bool(e.AllowToken), Protected: bool(e.Protected)}
	}
	return s, nil
}

// Endpoint returns the schema of method on the path template, if present.
func (s *Schema) Endpoint(method, path string) (*Endpoint, bool) {
	e, ok := s.endpoints[method+" "+path]
	return e, ok
}

// Keys lists "METHOD /path" of every endpoint in the extract, sorted.
func (s *Schema) Keys() []string {
	out := make([]string, 0, len(s.endpoints))
	for k := range s.endpoints {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// compile prepares patterns and inline property-string formats recursively.
func (p *Prop) compile() error {
	if p.Pattern != "" {
		re, err := regexp.Compile("^(?:" + perlToGoRegexp(p.Pattern) + ")$")
		if err != nil {
			return fmt.Errorf("pattern %q: %w", p.Pattern, err)
		}
		p.re = re
	}
	if m, ok := p.Format.(map[string]any); ok {
		raw, _ := json.Marshal(m)
		var fm map[string]*Prop
		if err := json.Unmarshal(raw, &fm); err != nil {
			return fmt.Errorf("format: %w", err)
		}
		for k, sub := range fm {
			if err := sub.compile(); err != nil {
				return fmt.Errorf("format key %s: %w", k, err)
			}
		}
		p.formatMap = fm
	}
	if p.Items != nil {
		if err := p.Items.compile(); err != nil {
			return err
		}
	}
	for k, sub := range p.Properties {
		if err := sub.compile(); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

var (
	perlQuant = regexp.MustCompile(`\{,(\d+)\}`)
	bigQuant  = regexp.MustCompile(`\{(\d+),(\d{4,})\}`)
)

// perlToGoRegexp rewrites the few Perl-only constructs in the schema's
// patterns: "(?^:x)" / "(?^i:x)" stringified qr// groups and "{,n}".
func perlToGoRegexp(p string) string {
	p = strings.ReplaceAll(p, "(?^:", "(?:")
	p = strings.ReplaceAll(p, "(?^i:", "(?i:")
	p = perlQuant.ReplaceAllString(p, "{0,$1}")
	// Go caps repeat counts at 1000. The one schema pattern above that
	// ("keys" of /access/users, [..]{0,4096}) is relaxed to an open bound.
	return bigQuant.ReplaceAllStringFunc(p, func(m string) string {
		sub := bigQuant.FindStringSubmatch(m)
		if len(sub[2]) > 3 && sub[2] > "1000" || len(sub[2]) > 4 {
			return "{" + sub[1] + ",}"
		}
		return m
	})
}

// typeName returns the schema type as a single string ("" when absent).
func (p *Prop) typeName() string {
	if s, ok := p.Type.(string); ok {
		return s
	}
	return ""
}

// lookup finds the schema of parameter name, resolving indexed names such as
// net0 against "net[n]".
func (p *Prop) lookup(name string) (*Prop, bool) {
	if sub, ok := p.Properties[name]; ok {
		return sub, true
	}
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	if i == len(name) || i == 0 {
		return nil, false
	}
	if len(name)-i > 1 && name[i] == '0' {
		return nil, false
	}
	if n, _ := strconv.Atoi(name[i:]); indexedCount[name[:i]] > 0 && n >= indexedCount[name[:i]] {
		return nil, false
	}
	sub, ok := p.Properties[name[:i]+"[n]"]
	return sub, ok
}

// indexedCount is how many instances of an indexed drive property
// qemu-server's confdesc defines (Drive.pm $MAX_IDE_DISKS 4,
// $MAX_SATA_DISKS 6, $MAX_SCSI_DISKS 31, $MAX_VIRTIO_DISKS 16: ide0-ide3,
// ...): the API's schema extract collapses them into one "ide[n]", and a
// name past them is not in the schema (PVE::JSONSchema: "property is not
// defined in schema ..."). Other indexed properties are not bounded here.
var indexedCount = map[string]int{"ide": 4, "sata": 6, "scsi": 31, "virtio": 16}
