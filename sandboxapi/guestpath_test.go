package sandboxapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestFilesUncleanPaths: schemathesis ST202 on PUT files (the bed, a real
// guest): the document's path rule allows any absolute path, the guest
// agent client takes clean ones only (qga checkGuestPath), so "/a//b" or
// "/a/." answered 400. Every path here matches the document's rule; the
// daemon hands the guest the cleaned path (the fake guest, like qga,
// refuses an unclean one), and a write naming a directory is
// is-a-directory.
func TestFilesUncleanPaths(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	files := "/v1/sandboxes/" + sb.ID + "/vms/vm0/files?path="
	re := regexp.MustCompile(docPathPattern(t, e))
	tests := []struct {
		path  string
		write int    // the write's status
		typ   string // its problem type, if any
	}{
		{"/a//b", http.StatusNoContent, ""},
		{"//c", http.StatusNoContent, ""},
		{"/d/./e", http.StatusNoContent, ""},
		{"/f/../g", http.StatusNoContent, ""},
		{"/../h", http.StatusNoContent, ""},
		{"/i/", http.StatusConflict, apitype.ProblemIsDirectory},
		{"/j/.", http.StatusConflict, apitype.ProblemIsDirectory},
		{"/k/..", http.StatusConflict, apitype.ProblemIsDirectory},
		{"/", http.StatusConflict, apitype.ProblemIsDirectory},
		{"/tmp", http.StatusConflict, apitype.ProblemIsDirectory},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			if !re.MatchString(tc.path) {
				t.Fatalf("%q does not match the document's path rule %s", tc.path, re)
			}
			q := url.QueryEscape(tc.path)
			resp := e.raw("PUT", files+q, "application/octet-stream", strings.NewReader(tc.path))
			if resp.StatusCode != tc.write {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("PUT %q: status %d, want %d: %s", tc.path, resp.StatusCode, tc.write, b)
			}
			if tc.typ != "" {
				if p := decodeProblemResp(t, resp); p.Type != tc.typ {
					t.Errorf("PUT %q: type %q, want %q", tc.path, p.Type, tc.typ)
				}
				return
			}
			resp.Body.Close()
			for _, read := range []string{tc.path, path.Clean(tc.path)} {
				resp := e.raw("GET", files+url.QueryEscape(read), "", nil)
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK || !bytes.Equal(b, []byte(tc.path)) {
					t.Errorf("GET %q after PUT %q: %d %q", read, tc.path, resp.StatusCode, b)
				}
			}
		})
	}
}

// docPathPattern is the pattern of PUT files' path parameter in the served
// OpenAPI document.
func docPathPattern(t *testing.T, e *env) string {
	t.Helper()
	resp := e.raw("GET", "/v1/openapi.json", "", nil)
	defer resp.Body.Close()
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name   string `json:"name"`
				Schema struct {
					Pattern string `json:"pattern"`
				} `json:"schema"`
			} `json:"parameters"`
		} `json:"paths"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, p := range doc.Paths["/v1/sandboxes/{id}/vms/{vm}/files"]["put"].Parameters {
		if p.Name == "path" && p.Schema.Pattern != "" {
			return p.Schema.Pattern
		}
	}
	t.Fatal("the document has no pattern for PUT files' path")
	return ""
}
