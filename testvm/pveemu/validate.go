package pveemu

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ParamErrors maps a parameter name to Proxmox's verification message, as in
// the "errors" member of a 400 "Parameter verification failed." response.
type ParamErrors map[string]string

func (e ParamErrors) add(path, msg string) {
	if old, ok := e[path]; ok {
		// PVE::JSONSchema joins repeated errors with a literal backslash-n.
		e[path] = old + `\n` + msg
		return
	}
	e[path] = msg
}

// Validate checks params against the endpoint's parameter schema the way
// PVE::JSONSchema::validate does and returns nil when they pass. Values are
// what the request decoder produced: string, []string (repeated form keys),
// or JSON values (string, json.Number, bool, []any, map[string]any, nil).
func (ep *Endpoint) Validate(params map[string]any) ParamErrors {
	errs := ParamErrors{}
	checkObject("", ep.Params, params, errs)
	if len(errs) == 0 {
		return nil
	}
	return errs
}

func checkObject(path string, schema *Prop, value map[string]any, errs ParamErrors) {
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	names := make([]string, 0, len(schema.Properties))
	for k := range schema.Properties {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if strings.HasSuffix(k, "[n]") {
			continue // indexed properties are checked per instance below
		}
		checkProp(join(k), schema.Properties[k], value[k], errs)
	}
	keys := make([]string, 0, len(value))
	for k := range value {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, direct := schema.Properties[k]; direct {
			if req, ok := schema.Properties[k].Requires.(string); ok && value[req] == nil {
				errs.add(join(req), fmt.Sprintf("missing property required by '%s'", join(k)))
			}
			continue
		}
		if sub, ok := schema.lookup(k); ok {
			checkProp(join(k), sub, value[k], errs)
			continue
		}
		if allowsAdditional(schema.AdditionalProperties) {
			continue
		}
		errs.add(join(k), "property is not defined in schema and the schema does not allow additional properties")
	}
}

// allowsAdditional mirrors Perl's "defined($ap) && !$ap" test: only an
// explicit false value forbids unknown properties.
func allowsAdditional(ap any) bool {
	switch t := ap.(type) {
	case nil:
		return true
	case float64:
		return t != 0
	case bool:
		return t
	case string:
		return t != "0" && t != ""
	}
	return true
}

func checkProp(path string, schema *Prop, value any, errs ParamErrors) {
	if schema.Alias != "" {
		return
	}
	if value == nil {
		if !schema.Optional {
			errs.add(path, "property is missing and it is not optional")
		}
		return
	}
	if !checkType(path, schema.typeName(), value, errs) {
		return
	}
	switch v := value.(type) {
	case []any:
		if schema.Items != nil {
			for i, el := range v {
				checkProp(fmt.Sprintf("%s[%d]", path, i), schema.Items, el, errs)
			}
		}
		return
	case []string:
		if schema.Items != nil {
			for i, el := range v {
				checkProp(fmt.Sprintf("%s[%d]", path, i), schema.Items, el, errs)
			}
		}
		return
	case map[string]any:
		if schema.Properties != nil || schema.AdditionalProperties != nil {
			checkObject(path, schema, v, errs)
		}
		return
	}
	s, isBool := scalarString(value)
	if isBool {
		return // a JSON boolean passed the boolean type check
	}
	if schema.Format != nil {
		if err := checkFormat(schema, s); err != nil {
			errs.add(path, "invalid format - "+err.Error())
			return
		}
	}
	if schema.re != nil && !schema.re.MatchString(s) {
		errs.add(path, "value does not match the regex pattern")
		return
	}
	if schema.MaxLength != nil && utf8.RuneCountInString(s) > int(*schema.MaxLength) {
		errs.add(path, fmt.Sprintf("value may only be %s characters long", numText(*schema.MaxLength)))
		return
	}
	if schema.MinLength != nil && utf8.RuneCountInString(s) < int(*schema.MinLength) {
		errs.add(path, fmt.Sprintf("value must be at least %s characters long", numText(*schema.MinLength)))
		return
	}
	if isNumber(s) {
		f, _ := strconv.ParseFloat(s, 64)
		if schema.Maximum != nil && f > float64(*schema.Maximum) {
			errs.add(path, fmt.Sprintf("value must have a maximum value of %s", numText(*schema.Maximum)))
			return
		}
		if schema.Minimum != nil && f < float64(*schema.Minimum) {
			errs.add(path, fmt.Sprintf("value must have a minimum value of %s", numText(*schema.Minimum)))
			return
		}
	}
	if len(schema.Enum) > 0 {
		texts := make([]string, len(schema.Enum))
		found := false
		for i, e := range schema.Enum {
			texts[i] = fmt.Sprint(e)
			if texts[i] == s {
				found = true
			}
		}
		if !found {
			errs.add(path, fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", s, strings.Join(texts, ", ")))
		}
	}
}

func numText(n flexNum) string {
	f := float64(n)
	if f == math.Trunc(f) {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// scalarString renders a scalar as Perl would see it; isBool reports a JSON
// boolean (a JSON::PP::Boolean reference in Perl).
func scalarString(v any) (s string, isBool bool) {
	switch t := v.(type) {
	case string:
		return t, false
	case json.Number:
		return t.String(), false
	case bool:
		return "", true
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64), false
	}
	return fmt.Sprint(v), false
}

func refName(v any) string {
	switch v.(type) {
	case []any, []string:
		return "ARRAY"
	case map[string]any:
		return "HASH"
	case bool:
		return "JSON::PP::Boolean"
	}
	return ""
}

var (
	reInteger = regexp.MustCompile(`^[+-]?\d+$`)
	reNumber  = regexp.MustCompile(`^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?$`)
)

func isNumber(s string) bool { return reNumber.MatchString(s) }

// checkType is PVE::JSONSchema::check_type for the types the schema uses.
func checkType(path, typ string, value any, errs ParamErrors) bool {
	if typ == "" || typ == "any" {
		return true
	}
	ref := refName(value)
	switch typ {
	case "array":
		if ref != "ARRAY" {
			errs.add(path, "type check ('array') failed")
			return false
		}
		return true
	case "object":
		if ref != "HASH" {
			errs.add(path, "type check ('object') failed")
			return false
		}
		return true
	}
	if ref != "" {
		if typ == "boolean" && ref == "JSON::PP::Boolean" {
			return true
		}
		errs.add(path, fmt.Sprintf("type check ('%s') failed - got %s", typ, ref))
		return false
	}
	s, _ := scalarString(value)
	switch typ {
	case "boolean":
		if s != "0" && s != "1" {
			errs.add(path, fmt.Sprintf("type check ('boolean') failed - got '%s'", s))
			return false
		}
	case "integer":
		if !reInteger.MatchString(s) {
			errs.add(path, fmt.Sprintf("type check ('integer') failed - got '%s'", s))
			return false
		}
	case "number":
		if !isNumber(s) {
			errs.add(path, fmt.Sprintf("type check ('number') failed - got '%s'", s))
			return false
		}
	}
	return true
}
