package sandboxapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// schemaTypes are the named schemas of the OpenAPI document.
var schemaTypes = map[string]any{
	"CreateRequest":        apitype.CreateRequest{},
	"VMRequest":            apitype.VMRequest{},
	"NIC":                  apitype.NIC{},
	"NetworkRequest":       apitype.NetworkRequest{},
	"DHCPRange":            apitype.DHCPRange{},
	"Sandbox":              apitype.Sandbox{},
	"SandboxList":          apitype.SandboxList{},
	"Network":              apitype.Network{},
	"VM":                   apitype.VM{},
	"VMAddress":            apitype.VMAddress{},
	"ExtendRequest":        apitype.ExtendRequest{},
	"ValidateReport":       apitype.ValidateReport{},
	"ExecRequest":          apitype.ExecRequest{},
	"ExecResult":           apitype.ExecResult{},
	"ExecEvent":            apitype.ExecEvent{},
	"SnapshotRequest":      apitype.SnapshotRequest{},
	"CheckRequest":         apitype.CheckRequest{},
	"CheckRow":             apitype.CheckRow{},
	"CheckReport":          apitype.CheckReport{},
	"CheckSampling":        apitype.CheckSampling{},
	"Health":               apitype.Health{},
	"Capacity":             apitype.Capacity{},
	"CapacityUse":          apitype.CapacityUse{},
	"SandboxCaps":          apitype.SandboxCaps{},
	"EgressPolicy":         apitype.EgressPolicy{},
	"EgressStatus":         apitype.EgressStatus{},
	"EgressDenial":         apitype.EgressDenial{},
	"EgressLog":            apitype.EgressLog{},
	"EgressRecord":         apitype.EgressRecord{},
	"EgressCounts":         apitype.EgressCounts{},
	"Problem":              apitype.Problem{},
	"SandboxHealth":        apitype.SandboxHealth{},
	"VMHealth":             apitype.VMHealth{},
	"HostSignals":          apitype.HostSignals{},
	"GuestReport":          apitype.GuestReport{},
	"GuestFilesystem":      apitype.GuestFilesystem{},
	"Event":                apitype.Event{},
	"PoolStatus":           apitype.PoolStatus{},
	"PoolShapeStatus":      apitype.PoolShapeStatus{},
	"PoolMember":           apitype.PoolMember{},
	"TemplateBuildRequest": apitype.TemplateBuildRequest{},
	"TemplateBuild":        apitype.TemplateBuild{},
	"TemplateInfo":         apitype.TemplateInfo{},
}

var timeType = reflect.TypeOf(time.Time{})

// schemaOf renders a Go type as an OpenAPI schema; named struct types in
// schemaTypes become references.
func schemaOf(t reflect.Type, top bool) map[string]any {
	if t == timeType {
		return map[string]any{"type": "string", "format": "date-time"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return schemaOf(t.Elem(), false)
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int64, reflect.Int32:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Uint64:
		return map[string]any{"type": "integer", "format": "int64", "minimum": 0}
	case reflect.Float64:
		return map[string]any{"type": "number", "format": "double"}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "format": "byte"}
		}
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), false)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), false)}
	case reflect.Struct:
		if _, ok := schemaTypes[t.Name()]; ok && !top {
			return map[string]any{"$ref": "#/components/schemas/" + t.Name()}
		}
		props := map[string]any{}
		var req []string
		var walk func(t reflect.Type)
		walk = func(t reflect.Type) {
			for i := 0; i < t.NumField(); i++ {
				f := t.Field(i)
				if f.Anonymous {
					walk(f.Type)
					continue
				}
				tag := f.Tag.Get("json")
				if tag == "-" || !f.IsExported() {
					continue
				}
				name, opts, _ := strings.Cut(tag, ",")
				if name == "" {
					name = f.Name
				}
				props[name] = schemaOf(f.Type, false)
				if !strings.Contains(opts, "omitempty") {
					req = append(req, name)
				}
			}
		}
		walk(t)
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(req) > 0 {
			s["required"] = req
		}
		return s
	}
	return map[string]any{}
}

// bounds are limits the validators (decode.go) enforce, said in the
// document as "Schema.property" keywords, so that a request the schema
// allows is one the daemon accepts (schemathesis ST202 found the extend TTL
// unbounded in the document).
func (s *Server) bounds() map[string]map[string]any {
	maxTTL := int64(s.o.MaxTTL / time.Second)
	return map[string]map[string]any{
		"ExtendRequest.ttl_seconds": {"minimum": 1, "maximum": maxTTL},
		"CreateRequest.ttl_seconds": {"minimum": 0, "maximum": maxTTL},
		// a build without boot takes an upload (PUT .../image): POST none
		"TemplateBuildRequest.import_only": {"enum": []any{false}, "description": "not taken here: a build without boot is an upload's (PUT /v1/templates/build/{name}/image?import_only=true)"},
		"TemplateBuildRequest.disk_bus":    {"enum": []string{""}, "description": "not taken here (an upload's with import_only)"},
		"TemplateBuildRequest.os_type":     {"enum": []string{""}, "description": "not taken here (an upload's with import_only)"},
	}
}

// OpenAPI returns the OpenAPI 3 document of the routes this server serves.
func (s *Server) OpenAPI() map[string]any {
	schemas := map[string]any{}
	for name, v := range schemaTypes {
		schemas[name] = schemaOf(reflect.TypeOf(v), true)
	}
	for _, rules := range []map[string]map[string]any{s.bounds(), s.createRules(), s.egressRules()} {
		for prop, kw := range rules {
			name, field, _ := strings.Cut(prop, ".")
			ps := schemas[name].(map[string]any)
			if field != "" {
				ps = ps["properties"].(map[string]any)[field].(map[string]any)
			}
			for k, v := range kw {
				ps[k] = v
			}
		}
	}
	// an absent mode is open (apitype.EgressPolicy)
	delete(schemas["EgressPolicy"].(map[string]any), "required")
	if s.eo.Egress == nil {
		// this node refuses every egress policy: the document has none
		delete(schemas["CreateRequest"].(map[string]any)["properties"].(map[string]any), "egress")
	}
	probSchema := schemas["Problem"].(map[string]any)
	probSchema["properties"].(map[string]any)["type"] = map[string]any{"type": "string", "enum": apitype.ProblemTypes()}
	probSchema["additionalProperties"] = true
	problem := map[string]any{"description": "problem document", "content": map[string]any{
		problemContentType: map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Problem"}}}}
	paths := map[string]any{}
	for _, rt := range s.routes {
		item, _ := paths[rt.path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.path] = item
		}
		op := map[string]any{
			"summary":     rt.summary,
			"operationId": strings.ToLower(rt.method) + strings.NewReplacer("/v1", "", "/", "_", "{", "", "}", "", ".", "_").Replace(rt.path),
			"security":    []any{map[string]any{"bearer": []string{rt.scope}}},
			"x-scope":     rt.scope,
		}
		if rt.node {
			op["x-node-operation"] = true
		}
		var params []any
		for _, p := range rt.params {
			ps := map[string]any{"type": "string"}
			if p.schema != nil {
				ps = p.schema()
			}
			params = append(params, map[string]any{"name": p.name, "in": p.in, "required": p.required, "description": p.desc, "schema": ps})
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		switch {
		case rt.request != "":
			op["requestBody"] = map[string]any{"required": rt.path != "/v1/sandboxes/{id}/check", "content": map[string]any{
				"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/" + rt.request}}}}
		case rt.requestType != "":
			op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				rt.requestType: map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}}
		}
		ok := map[string]any{"description": "success"}
		switch {
		case rt.response != "":
			content := map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/" + rt.response}}}
			switch rt.response {
			case "ExecResult":
				content["application/x-ndjson"] = map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/ExecEvent"}}
			case "EgressLog":
				content["application/x-ndjson"] = map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/EgressRecord"}}
				ok["headers"] = egressLogHeaders()
			}
			ok["content"] = content
		case rt.responseType != "":
			ok["content"] = map[string]any{rt.responseType: map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}
		case rt.path == "/v1/openapi.json":
			ok["content"] = map[string]any{"application/json": map[string]any{"schema": map[string]any{"type": "object"}}}
		}
		op["responses"] = map[string]any{
			httpCode(rt.okStatus): ok,
			"default":             problem,
		}
		item[strings.ToLower(rt.method)] = op
	}
	if s.eo.Egress == nil {
		// this node answers its egress routes with a problem (schemathesis
		// ST101 and ST202 found them undeclared): the document says which
		egress := paths["/v1/sandboxes/{id}/egress"].(map[string]any)
		for method, typ := range map[string]string{"get": apitype.ProblemUnavailable, "put": apitype.ProblemInvalidRequest} {
			egress[method].(map[string]any)["responses"].(map[string]any)[httpCode(problemStatus[typ])] = problemResponse(
				"egress policies are not enabled on this node: every call of this operation answers this", typ)
		}
	}
	if _, ok := s.eo.Egress.(sandbox.EgressRecorder); !ok {
		// this node keeps no egress record: every read answers unavailable
		log := paths["/v1/sandboxes/{id}/egress/log"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)
		log[httpCode(problemStatus[apitype.ProblemUnavailable])] = problemResponse(
			"this node keeps no egress record (egress policies are not enabled): every call of this operation answers this", apitype.ProblemUnavailable)
	}
	// an egress record read past its owner's or the node's reads in flight
	logResp := paths["/v1/sandboxes/{id}/egress/log"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)
	logReadRefusals(logResp, "")
	s.deleteResponses(paths["/v1/sandboxes/{id}"].(map[string]any)["delete"].(map[string]any)["responses"].(map[string]any))
	// a filter naming no VM of the sandbox (schemathesis ST202: a
	// schema-valid vm= that the sandbox has not), or out of its range
	logResp[httpCode(http.StatusBadRequest)] = problemResponse(
		"vm names no VM of the sandbox, or type, since or limit is out of its range", apitype.ProblemInvalidRequest)
	s.templateResponses(paths)
	// a stream past its caps, a filter past its bound (events.go)
	events := paths["/v1/events"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)
	tooMany := problemResponse(fmt.Sprintf(
		"the caller's token (%d), owner (%d) or the node (%d) has as many event streams open as it may",
		s.o.Streams.PerToken, s.o.Streams.PerOwner, s.o.Streams.Node), apitype.ProblemTooManyRequests)
	tooMany["headers"] = retryAfterHeaders()
	events[httpCode(http.StatusTooManyRequests)] = tooMany
	events[httpCode(http.StatusBadRequest)] = problemResponse(fmt.Sprintf(
		"a filter is not a sandbox id or event type, or lists more than %d of them", maxFilterItems), apitype.ProblemInvalidRequest)
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{
			"title":       "pve-inspect sandbox API",
			"version":     "1",
			"description": "Sandbox lifecycle, guest I/O and containment check (DESIGN.md section 5). Unix-socket callers act as admin; TCP callers present a bearer token. Scopes: admin > exec > read.",
		},
		"paths": paths,
		"components": map[string]any{
			"schemas": schemas,
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer"},
			},
		},
	}
}

// retryAfterHeaders declares the Retry-After header of a refusal the
// client may retry.
func retryAfterHeaders() map[string]any {
	return map[string]any{"Retry-After": map[string]any{"description": "seconds to wait before trying again", "schema": map[string]any{"type": "integer"}}}
}

// logReadRefusals declares in resp the refusals of an egress record read
// past its owner's or the node's reads in flight (429, 503; a status
// declared already is left as it is), more added to their descriptions
// when set.
func logReadRefusals(resp map[string]any, more string) {
	for status, typ := range map[int]string{http.StatusTooManyRequests: apitype.ProblemTooManyRequests, http.StatusServiceUnavailable: apitype.ProblemUnavailable} {
		if _, ok := resp[httpCode(status)]; ok {
			continue
		}
		desc := fmt.Sprintf("the sandbox's owner (%d) or the node (%d) has as many egress record reads in flight as it may; retry after Retry-After", ownerLogReads, maxLogReads)
		if more != "" {
			desc += "; " + more
		}
		r := problemResponse(desc, typ)
		r["headers"] = retryAfterHeaders()
		resp[httpCode(status)] = r
	}
}

// deleteResponses declares the answers of DELETE /v1/sandboxes/{id} with
// egress_log=true (deleteKeepingEgress) besides its 204: the record
// (200), and the refusals that delete nothing (400, 404, 409, 503).
func (s *Server) deleteResponses(resp map[string]any) {
	resp[httpCode(http.StatusOK)] = map[string]any{
		"description": "egress_log=true: the sandbox is deleted; its whole egress record as it stood once its VMs were gone, oldest first (more is false)",
		"headers":     egressLogHeaders(),
		"content": map[string]any{
			"application/json":     map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/EgressLog"}},
			"application/x-ndjson": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/EgressRecord"}},
		},
	}
	resp[httpCode(http.StatusBadRequest)] = problemResponse("egress_log is neither true nor false: nothing is deleted", apitype.ProblemInvalidRequest)
	resp[httpCode(http.StatusNotFound)] = problemResponse(
		"another owner's sandbox; with egress_log=true also a sandbox already gone (its record went with its delete): nothing is deleted", apitype.ProblemNotFound)
	resp[httpCode(http.StatusConflict)] = problemResponse(
		"egress_log=true of a sandbox being created (its record reads empty until it is ready): nothing is deleted", apitype.ProblemConflict)
	if _, ok := s.eo.Egress.(sandbox.EgressTaker); !ok {
		resp[httpCode(http.StatusServiceUnavailable)] = problemResponse(
			"this node keeps no egress record (egress policies are not enabled): every call with egress_log=true answers this, and nothing is deleted", apitype.ProblemUnavailable)
	}
}

// egressLogHeaders are the headers of an egress record page answered as
// NDJSON (getEgressLog): the page's fields that are not records.
func egressLogHeaders() map[string]any {
	h := func(typ, desc string) map[string]any {
		return map[string]any{"description": desc, "schema": map[string]any{"type": typ}}
	}
	return map[string]any{
		"X-Egress-Dropped": h("integer", "application/x-ndjson only: the sandbox's records dropped so far (EgressLog.dropped)"),
		"X-Egress-Next":    h("integer", "application/x-ndjson only: the since of the next page (EgressLog.next)"),
		"X-Egress-More":    h("boolean", "application/x-ndjson only: whether records past next match (EgressLog.more)"),
	}
}

// problemResponse is a response of problem documents of the given types
// only, described by desc.
func problemResponse(desc string, types ...string) map[string]any {
	return map[string]any{"description": desc, "content": map[string]any{problemContentType: map[string]any{"schema": map[string]any{
		"allOf": []any{
			map[string]any{"$ref": "#/components/schemas/Problem"},
			map[string]any{"type": "object", "required": []string{"type"}, "properties": map[string]any{"type": map[string]any{"type": "string", "enum": types}}},
		}}}}}
}

func httpCode(c int) string {
	b, _ := json.Marshal(c)
	return string(b)
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request, _ principal) error {
	return writeJSON(w, http.StatusOK, s.OpenAPI())
}
