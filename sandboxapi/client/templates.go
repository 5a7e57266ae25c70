package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// BuildTemplate calls POST /v1/templates/build: the build started or
// joined (queued or running), or the template that exists (done,
// reused). A node operation: an owner-bound token is refused.
func (c *Client) BuildTemplate(ctx context.Context, req apitype.TemplateBuildRequest) (apitype.TemplateBuild, error) {
	var b apitype.TemplateBuild
	return b, c.do(ctx, "POST", "/v1/templates/build", req, &b)
}

// TemplateBuild calls GET /v1/templates/builds/{name}: the state of the
// node's running or last build of the template.
func (c *Client) TemplateBuild(ctx context.Context, name string) (apitype.TemplateBuild, error) {
	var b apitype.TemplateBuild
	return b, c.do(ctx, "GET", "/v1/templates/builds/"+url.PathEscape(name), nil, &b)
}

// Template calls GET /v1/templates/{name}: the VM template a create of
// the name clones on the node, and the image the node's build ledger
// records it was built from (any token may ask).
func (c *Client) Template(ctx context.Context, name string) (apitype.TemplateInfo, error) {
	var t apitype.TemplateInfo
	return t, c.do(ctx, "GET", "/v1/templates/"+url.PathEscape(name), nil, &t)
}

// UploadTemplate calls PUT /v1/templates/build/{name}/image: the template
// u.Name built from the image body, u.Size bytes (its length, sent as the
// Content-Length). A template of the name that exists answers done and
// reused, a running build of the same upload joined, without the body.
func (c *Client) UploadTemplate(ctx context.Context, u apitype.TemplateUpload, body io.Reader) (apitype.TemplateBuild, error) {
	q := url.Values{"file": {u.File}, "sha256": {u.SHA256}}
	for k, v := range map[string]string{"ova_disk": u.OVADisk, "disk_bus": u.DiskBus, "os_type": u.OSType} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if u.ImportOnly {
		q.Set("import_only", "true")
	}
	req, err := c.newRequest(ctx, "PUT", "/v1/templates/build/"+url.PathEscape(u.Name)+"/image?"+q.Encode(), body)
	if err != nil {
		return apitype.TemplateBuild{}, err
	}
	req.ContentLength = u.Size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return apitype.TemplateBuild{}, fmt.Errorf("upload template image: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return apitype.TemplateBuild{}, decodeProblem(resp)
	}
	var b apitype.TemplateBuild
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		return apitype.TemplateBuild{}, fmt.Errorf("upload template image: %w", err)
	}
	return b, nil
}
