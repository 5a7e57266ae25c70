package pveemu

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// request is one decoded, authenticated API call.
type request struct {
	params map[string]any
	authid string // user or "user@realm!token"
	token  bool
	route  *route
	// local is the node whose API was called (its pveproxy).
	local string
}

// taskNode is the node a task of this request runs on: the path's node,
// or for a cluster-wide call the node whose API was called.
func (rq *request) taskNode() string {
	if n := rq.str("node"); n != "" {
		return n
	}
	return rq.local
}

// decodeParams merges the body (JSON or urlencoded) and the query string the
// way pve-http-server's extract_params does.
func decodeParams(r *http.Request, body []byte) (map[string]any, error) {
	params := map[string]any{}
	if len(body) > 0 {
		ct := strings.TrimSpace(strings.SplitN(r.Header.Get("Content-Type"), ";", 2)[0])
		if strings.EqualFold(ct, "application/json") {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.UseNumber()
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				return nil, fail("malformed JSON string: %s", strings.TrimSpace(err.Error()))
			}
			if dec.More() {
				return nil, fail("garbage after JSON object")
			}
			for k, v := range m {
				params[k] = v
			}
		} else {
			for k, v := range decodeURLEncoded(string(body)) {
				params[k] = v
			}
		}
	}
	for k, v := range decodeURLEncoded(r.URL.RawQuery) {
		params[k] = v
	}
	return params, nil
}

// decodeURLEncoded splits on & and ;, keeps the text between the first and
// a second "=" (Perl's list-context split), and turns repeated keys into a
// list, like pve-http-server's decode_urlencoded.
func decodeURLEncoded(data string) map[string]any {
	res := map[string]any{}
	if data == "" {
		return res
	}
	for _, kv := range strings.FieldsFunc(data, func(r rune) bool { return r == '&' || r == ';' }) {
		parts := strings.SplitN(kv, "=", 3)
		k := unescapeForm(parts[0])
		if len(parts) < 2 {
			res[k] = nil
			continue
		}
		v := unescapeForm(parts[1])
		switch old := res[k].(type) {
		case string:
			res[k] = []string{old, v}
		case []string:
			res[k] = append(old, v)
		default:
			res[k] = v
		}
	}
	return res
}

func unescapeForm(s string) string {
	s = strings.ReplaceAll(s, "+", " ")
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(n))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func (rq *request) str(name string) string {
	v, ok := rq.params[name]
	if !ok || v == nil {
		return ""
	}
	s, isBool := scalarString(v)
	if isBool {
		if v.(bool) {
			return "1"
		}
		return "0"
	}
	return s
}

func (rq *request) has(name string) bool { v, ok := rq.params[name]; return ok && v != nil }

func (rq *request) int(name string, def int) int {
	if !rq.has(name) {
		return def
	}
	n, err := strconv.Atoi(strings.TrimPrefix(rq.str(name), "+"))
	if err != nil {
		return def
	}
	return n
}

func (rq *request) bool(name string, def bool) bool {
	if !rq.has(name) {
		return def
	}
	return rq.str(name) == "1"
}

func (rq *request) strings(name string) []string {
	switch t := rq.params[name].(type) {
	case []string:
		return t
	case []any:
		out := make([]string, 0, len(t))
		for _, x := range t {
			s, _ := scalarString(x)
			out = append(out, s)
		}
		return out
	case string:
		return []string{t}
	}
	return nil
}

// normalizeLegacyParams is RESTHandler's normalize_legacy_param_formats:
// for top-level parameters with a true value, a list for a "-list" string
// becomes comma-joined and a scalar for an array becomes a one-element list
// (www-form-urlencoded cannot express either).
func normalizeLegacyParams(schema *Prop, params map[string]any) {
	for k, v := range params {
		sub, ok := schema.lookup(k)
		if !ok || v == nil {
			continue
		}
		if s, isBool := scalarString(v); !isBool && refName(v) == "" && (s == "" || s == "0") {
			continue
		}
		format, _ := sub.Format.(string)
		switch t := v.(type) {
		case []string:
			if sub.typeName() == "string" && strings.HasSuffix(format, "-list") {
				params[k] = strings.Join(t, ",")
			}
		case []any:
			if sub.typeName() == "string" && strings.HasSuffix(format, "-list") {
				parts := make([]string, len(t))
				for i, x := range t {
					parts[i], _ = scalarString(x)
				}
				params[k] = strings.Join(parts, ",")
			}
		default:
			if sub.typeName() == "array" && refName(v) == "" {
				params[k] = []any{v}
			}
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range reListSep.Split(s, -1) {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}
