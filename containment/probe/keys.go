package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// reportKeys are the exact object keys a report may use. encoding/json
// matches keys case-insensitively and lets a repeated key win silently;
// checkKeys closes both doors before decoding.
var reportKeys = map[string]bool{
	"version": true, "facts": true, "results": true,
	"interfaces": true, "default_route4": true, "default_route6": true, "resolvers": true, "errors": true,
	"name": true, "up": true, "addrs": true, "iface": true, "gateway": true,
	"id": true, "outcome": true, "http_status": true, "rcode": true, "answers": true, "detail": true, "elapsed_ms": true,
	"canary": true, "calls": true, "op": true, "errno": true, "idmap": true, "type": true, "inside": true,
	"outside": true, "count": true,
}

// maxReportDepth is the deepest nesting a report has (report, facts,
// interfaces, interface, addrs) plus slack.
const maxReportDepth = 8

// checkKeys walks the JSON tokens of data and rejects unknown or
// differently cased keys, repeated keys within one object, and nesting
// deeper than maxReportDepth.
func checkKeys(data []byte) error {
	type frame struct {
		obj     bool
		wantKey bool
		seen    map[string]bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		top := (*frame)(nil)
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.obj {
					top.wantKey = false
				}
				if len(stack) == maxReportDepth {
					return fmt.Errorf("decode: nesting deeper than %d", maxReportDepth)
				}
				stack = append(stack, &frame{obj: v == '{', wantKey: v == '{', seen: map[string]bool{}})
			case '}', ']':
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if top != nil && top.obj && top.wantKey {
				if !reportKeys[v] {
					return fmt.Errorf("decode: unknown key %q", clip(v, 32))
				}
				if top.seen[v] {
					return fmt.Errorf("decode: repeated key %q", v)
				}
				top.seen[v] = true
				top.wantKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}
