package client

import (
	"context"
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
