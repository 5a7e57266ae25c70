package sandboxapi

import (
	"context"
	"net/http"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TemplateBuilder runs the node's template builds
// (templatebuild.Service). Start refuses a request as asked with a
// *sandbox.InvalidError, a build of the name from another source with an
// error wrapping sandbox.ErrConflict, a full queue with sandbox.ErrBusy.
type TemplateBuilder interface {
	Start(ctx context.Context, req apitype.TemplateBuildRequest) (apitype.TemplateBuild, error)
	Build(name string) (apitype.TemplateBuild, bool)
}

// buildsOff is the refusal of the build routes on a node without builds.
const buildsOff = "template builds are off on this node: an operator turns them on with [templates] build = true, " +
	"builder_user and builder_password_file (a root-only file) in /etc/pve-inspectd/config.toml and a restart " +
	"(README: Templates from images), or builds on the node as root: pve-inspectd template build NAME --recipe RECIPE"

var pTemplate = param{name: "name", in: "path", desc: "template name", required: true}

// templateRoutes are the template build routes: node operations, refused
// to owner-bound tokens whatever their scope (node: a template is shared
// by every owner, and a build makes the node download a URL).
func (s *Server) templateRoutes() []route {
	return []route{
		{method: "POST", path: "/v1/templates/build", scope: apitype.ScopeAdmin, node: true,
			summary: "Build a template on the node from a shipped recipe or an image URL with its checksum, or join the build of the name that runs (joined), or answer that the template exists (200, done, reused). " +
				"202: the build is queued or runs; follow it with GET /v1/templates/builds/{name} or the template.build.* events. A node operation: refused to owner-bound tokens, and on nodes without [templates] build",
			request: "TemplateBuildRequest", response: "TemplateBuild", okStatus: http.StatusAccepted, timeout: reqTimeout, h: s.startTemplateBuild},
		{method: "GET", path: "/v1/templates/builds/{name}", scope: apitype.ScopeAdmin, node: true,
			summary:  "The state and progress of the node's running or last build of a template (a node operation, as POST /v1/templates/build)",
			response: "TemplateBuild", okStatus: http.StatusOK, params: []param{pTemplate}, timeout: reqTimeout, h: s.getTemplateBuild},
	}
}

func (s *Server) startTemplateBuild(w http.ResponseWriter, r *http.Request, p principal) error {
	if s.o.Templates == nil {
		return newProblem(apitype.ProblemForbidden, buildsOff)
	}
	var req apitype.TemplateBuildRequest
	if pr := decodeJSON(w, r, maxJSONBody, &req); pr != nil {
		return pr
	}
	st, err := s.o.Templates.Start(r.Context(), req)
	if err != nil {
		return err
	}
	s.o.Logger.Info("template build asked", "template", req.Name, "by", p.who(), "state", st.State, "joined", st.Joined)
	code := http.StatusAccepted
	if st.State == apitype.BuildDone {
		code = http.StatusOK
	}
	w.Header().Set("Location", "/v1/templates/builds/"+st.Name)
	return writeJSON(w, code, st)
}

func (s *Server) getTemplateBuild(w http.ResponseWriter, r *http.Request, _ principal) error {
	if s.o.Templates == nil {
		return newProblem(apitype.ProblemForbidden, buildsOff)
	}
	name := r.PathValue("name")
	st, ok := s.o.Templates.Build(name)
	if !ok {
		return problemf(apitype.ProblemNotFound, "no build of template %q since the daemon started (POST /v1/templates/build starts one)", name)
	}
	return writeJSON(w, http.StatusOK, st)
}

// templateResponses declares the build routes' answers besides success.
func (s *Server) templateResponses(paths map[string]any) {
	post := paths["/v1/templates/build"].(map[string]any)["post"].(map[string]any)["responses"].(map[string]any)
	post[httpCode(http.StatusOK)] = map[string]any{"description": "the template exists (state done, reused): nothing is built",
		"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/TemplateBuild"}}}}
	post[httpCode(http.StatusBadRequest)] = problemResponse("an invalid name, an unknown recipe, a recipe the node cannot download (kali2025.4), an image URL without its checksum or refused (the node's own, loopback, link-local or metadata addresses): nothing is built", apitype.ProblemInvalidRequest)
	post[httpCode(http.StatusConflict)] = problemResponse("a build of the name from another source is queued or runs", apitype.ProblemConflict)
	post[httpCode(http.StatusServiceUnavailable)] = problemResponse("the node's build queue is full, the daemon starts or stops, or the builder cannot log in (its password file, its password): nothing is built", apitype.ProblemUnavailable)
	for _, op := range []map[string]any{post, paths["/v1/templates/builds/{name}"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)} {
		op[httpCode(http.StatusForbidden)] = problemResponse("an owner-bound token (a node operation), or template builds are off on this node", apitype.ProblemForbidden)
	}
}

// templateBuildsOn says whether the node builds templates on request.
func (s *Server) templateBuildsOn() bool { return s.o.Templates != nil }
