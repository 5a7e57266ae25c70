package sandboxapi_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// modeBuilder is fakeBuilder recording the uploads it is asked for.
type modeBuilder struct {
	*fakeBuilder
	mu  sync.Mutex
	got []apitype.TemplateUpload
}

func (m *modeBuilder) Upload(ctx context.Context, u apitype.TemplateUpload, body func() (io.Reader, func(), error)) (apitype.TemplateBuild, error) {
	m.mu.Lock()
	m.got = append(m.got, u)
	m.mu.Unlock()
	return m.fakeBuilder.Upload(ctx, u, body)
}

// TestTemplateUploadImportOnly: PUT /v1/templates/build/{name}/image
// takes import_only, disk_bus and os_type from the query and hands them
// to the builder (which checks them); an import_only that is not true or
// false is a 400 naming it before the builder is asked; the OpenAPI
// document declares the three with their values, and TemplateBuild
// carries the mode.
func TestTemplateUploadImportOnly(t *testing.T) {
	f := &modeBuilder{fakeBuilder: &fakeBuilder{builds: map[string]apitype.TemplateBuild{}}}
	e := newEnv(t, func(o *options) { o.serverOptions.Templates = f })
	ctx := e.ctx()
	u := apitype.TemplateUpload{Name: "victim", File: "ctf4.ova", SHA256: strings.Repeat("a", 64), Size: 5,
		BuildMode: apitype.BuildMode{ImportOnly: true, DiskBus: "ide", OSType: "l26"}}
	if _, err := e.c.UploadTemplate(ctx, u, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := slices.Clone(f.got)
	f.mu.Unlock()
	if len(got) != 1 || got[0].BuildMode != u.BuildMode || got[0].OVADisk != "" {
		t.Errorf("the builder was asked %+v, want the mode %+v", got, u.BuildMode)
	}

	for _, v := range []string{"yes", "1", "TRUE"} {
		resp := e.raw("PUT", "/v1/templates/build/victim/image?file=ctf4.ova&sha256="+u.SHA256+"&import_only="+v, "application/octet-stream", strings.NewReader("hello"))
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"field":"import_only"`) {
			t.Errorf("import_only=%s: %d %s, want 400 naming import_only", v, resp.StatusCode, b)
		}
	}
	f.mu.Lock()
	n := len(f.got)
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("a bad import_only reached the builder (%d uploads)", n)
	}

	doc, err := e.c.OpenAPI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := doc["paths"].(map[string]any)["/v1/templates/build/{name}/image"].(map[string]any)["put"].(map[string]any)
	params := map[string][]any{}
	for _, p := range put["parameters"].([]any) {
		pm := p.(map[string]any)
		s, _ := pm["schema"].(map[string]any)
		params[pm["name"].(string)], _ = s["enum"].([]any)
	}
	for name, want := range map[string][]any{"import_only": {"", "true", "false"}, "disk_bus": {"", "scsi", "ide", "sata"}, "os_type": {"", "l26", "win10", "win11"}} {
		if !slices.Equal(params[name], want) {
			t.Errorf("parameter %s: enum %v, want %v", name, params[name], want)
		}
	}
	props := doc["components"].(map[string]any)["schemas"].(map[string]any)["TemplateBuild"].(map[string]any)["properties"].(map[string]any)
	for _, k := range []string{"import_only", "disk_bus", "os_type"} {
		if _, ok := props[k]; !ok {
			t.Errorf("TemplateBuild declares no %s", k)
		}
	}
}
