package sandboxapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TemplateBuilder runs the node's template builds
// (templatebuild.Service). Start refuses a request as asked with a
// *sandbox.InvalidError, a build of the name from another source with an
// error wrapping sandbox.ErrConflict, a full queue with sandbox.ErrBusy.
type TemplateBuilder interface {
	Start(ctx context.Context, req apitype.TemplateBuildRequest) (apitype.TemplateBuild, error)
	// Template is the running or last build of name, else the template
	// of the name on the node (done, reused), each done one with the image
	// it was built from when the node's build ledger says (false: none).
	Template(ctx context.Context, name string) (apitype.TemplateBuild, bool, error)
	// Upload builds from the image body, u.Size bytes (templatebuild.Service.Upload):
	// it joins or answers an existing template without reading body.
	Upload(ctx context.Context, u apitype.TemplateUpload, body io.Reader) (apitype.TemplateBuild, error)
}

// uploadTimeout bounds an image upload (the body's transfer to the node
// and Proxmox's check of it).
func uploadTimeout(s *Server) time.Duration { return s.o.TemplateUploadTimeout }

// maxUploads is how many image uploads the node takes at once: each holds
// a connection and streams gigabytes to the node's image storage (the
// disk, pveproxy's temporary file, Proxmox's copy). One past it is
// refused before its body is read, 429 with Retry-After (quota
// image-uploads): the client tries again.
const maxUploads = 2

// uploadRetry is the Retry-After of a refused upload.
const uploadRetry = 10 * time.Second

// takeUpload takes an upload slot, or refuses (429, quota image-uploads).
func (s *Server) takeUpload() (release func(), err error) {
	select {
	case s.uploads <- struct{}{}:
		return func() { <-s.uploads }, nil
	default:
	}
	s.met.countRefusal("", "image-uploads")
	p := problemf(apitype.ProblemTooManyRequests,
		"the node takes %d image uploads at once and has as many in flight; retry after Retry-After", maxUploads)
	p.Quota = "image-uploads"
	return nil, &retryError{p: p, after: uploadRetry}
}

// buildsOff is the refusal of the build routes on a node without builds.
const buildsOff = "template builds are off on this node: an operator turns them on with [templates] build = true, " +
	"builder_user and builder_password_file (a root-only file) in /etc/pve-inspectd/config.toml and a restart " +
	"(README: Templates from images), or builds on the node as root: pve-inspectd template build NAME --recipe RECIPE"

var (
	pTemplate  = param{name: "name", in: "path", desc: "template name", required: true}
	pImageFile = param{name: "file", in: "query", desc: "the image's file name: .ova, .qcow2, .raw or .vmdk", required: true}
	pImageSum  = param{name: "sha256", in: "query", desc: "the image's sha256 digest (64 hex digits): Proxmox verifies the upload against it", required: true}
	pOVADisk   = param{name: "ova_disk", in: "query", desc: "for an .ova, the disk inside it to import (DISK.vmdk); only for an .ova"}
)

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
			summary:  "The state and progress of the node's running or last build of a template, else the template of the name the node's builds made (done, reused); a done one carries image, the digest of the image it was built from (sha256:HEX) when the node's build ledger records it, for a client that finds a template by name to compare with its own image (a node operation, as POST /v1/templates/build)",
			response: "TemplateBuild", okStatus: http.StatusOK, params: []param{pTemplate}, timeout: reqTimeout, h: s.getTemplateBuild},
		{method: "PUT", path: "/v1/templates/build/{name}/image", scope: apitype.ScopeAdmin, node: true,
			summary: "Build a template from an image sent as the body (Content-Length required, at most [templates] max_upload_gib): the daemon streams it to the node's image storage as a file of its digest's name, Proxmox verifies its sha256, and the build runs as one from a volume on the node. " +
				"A template of the name that exists answers 200 (done, reused), a running build of the same upload 202 (joined), both without reading the body; 202: the image is on the node and the build queued. A node operation, as POST /v1/templates/build",
			requestType: "application/octet-stream", response: "TemplateBuild", okStatus: http.StatusAccepted,
			params: []param{pTemplate, pImageFile, pImageSum, pOVADisk}, timeout: uploadTimeout, h: s.uploadTemplateImage},
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
	return writeBuild(w, st)
}

func (s *Server) uploadTemplateImage(w http.ResponseWriter, r *http.Request, p principal) error {
	if s.o.Templates == nil {
		return newProblem(apitype.ProblemForbidden, buildsOff)
	}
	if r.ContentLength < 0 {
		return &sandbox.InvalidError{Field: "Content-Length", Msg: "Content-Length: an image upload needs its length (the node's upload takes none without)"}
	}
	release, err := s.takeUpload()
	if err != nil {
		w.Header().Set("Connection", "close") // the body is not read
		return err
	}
	defer release()
	q := r.URL.Query()
	u := apitype.TemplateUpload{Name: r.PathValue("name"), File: q.Get("file"), SHA256: q.Get("sha256"), OVADisk: q.Get("ova_disk"), Size: r.ContentLength}
	body := s.idleBody(w, http.MaxBytesReader(w, r.Body, max(r.ContentLength, 1)))
	st, err := s.o.Templates.Upload(r.Context(), u, body)
	if err != nil {
		// a refused or failed upload leaves the body unread: close
		w.Header().Set("Connection", "close")
		return err
	}
	s.o.Logger.Info("template build from an upload asked", "template", u.Name, "file", u.File, "bytes", u.Size, "by", p.who(), "state", st.State, "joined", st.Joined)
	return writeBuild(w, st)
}

func (s *Server) getTemplateBuild(w http.ResponseWriter, r *http.Request, _ principal) error {
	if s.o.Templates == nil {
		return newProblem(apitype.ProblemForbidden, buildsOff)
	}
	name := r.PathValue("name")
	st, ok, err := s.o.Templates.Template(r.Context(), name)
	if err != nil {
		return err
	}
	if !ok {
		return problemf(apitype.ProblemNotFound, "no build of template %q since the daemon started and no template of the name built on the node (POST /v1/templates/build starts one)", name)
	}
	return writeJSON(w, http.StatusOK, st)
}

// templateResponses declares the build routes' answers besides success.
func (s *Server) templateResponses(paths map[string]any) {
	post := paths["/v1/templates/build"].(map[string]any)["post"].(map[string]any)["responses"].(map[string]any)
	post[httpCode(http.StatusOK)] = map[string]any{"description": "the template exists (state done, reused): nothing is built",
		"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/TemplateBuild"}}}}
	post[httpCode(http.StatusBadRequest)] = problemResponse("an invalid name, an unknown recipe, a recipe with a checksum (a recipe pins its own list: kali2025.4's .tar.xz, too, which the node downloads, unpacks and uploads itself), an image URL without its checksum or refused (the node's own, loopback, link-local or metadata addresses): nothing is built", apitype.ProblemInvalidRequest)
	post[httpCode(http.StatusConflict)] = problemResponse("a build of the name from another source is queued or runs", apitype.ProblemConflict)
	post[httpCode(http.StatusServiceUnavailable)] = problemResponse("the node's build queue is full, the daemon starts or stops, or the builder cannot log in (its password file, its password): nothing is built", apitype.ProblemUnavailable)
	put := paths["/v1/templates/build/{name}/image"].(map[string]any)["put"].(map[string]any)["responses"].(map[string]any)
	put[httpCode(http.StatusOK)] = post[httpCode(http.StatusOK)]
	put[httpCode(http.StatusBadRequest)] = problemResponse("an invalid name, file, sha256 or ova_disk, no Content-Length or one over [templates] max_upload_gib (field size), or a body whose sha256 is not the one given (field sha256): no template is built", apitype.ProblemInvalidRequest)
	put[httpCode(http.StatusConflict)] = problemResponse("a build of the name from another source is queued or runs, the template of the name exists built from another image, or the same image is being uploaded for another template", apitype.ProblemConflict)
	put[httpCode(http.StatusServiceUnavailable)] = post[httpCode(http.StatusServiceUnavailable)]
	tooMany := problemResponse(fmt.Sprintf("the node has as many image uploads in flight as it takes at once (%d; quota image-uploads): the body is not read; retry after Retry-After", maxUploads), apitype.ProblemTooManyRequests)
	tooMany["headers"] = retryAfterHeaders()
	put[httpCode(http.StatusTooManyRequests)] = tooMany
	for _, op := range []map[string]any{post, put, paths["/v1/templates/builds/{name}"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)} {
		op[httpCode(http.StatusForbidden)] = problemResponse("an owner-bound token (a node operation), or template builds are off on this node", apitype.ProblemForbidden)
	}
}

// templateBuildsOn says whether the node builds templates on request.
func (s *Server) templateBuildsOn() bool { return s.o.Templates != nil }

// idleBody is an upload's body whose read deadline moves to
// TemplateUploadIdle from now at each read that brought bytes, never past
// the route's own deadline (setDeadlines): a client that stops sending
// ends its upload (and gives its slot back) within TemplateUploadIdle.
// The read that ends the body leaves the deadline setDeadlines moves it
// to then.
func (s *Server) idleBody(w http.ResponseWriter, body io.Reader) io.Reader {
	rc := http.NewResponseController(w)
	limit := time.Now().Add(s.o.TemplateUploadTimeout)
	extend := func() {
		at := time.Now().Add(s.o.TemplateUploadIdle)
		if at.After(limit) {
			at = limit
		}
		_ = rc.SetReadDeadline(at)
	}
	extend()
	return readFunc(func(p []byte) (int, error) {
		n, err := body.Read(p)
		if n > 0 && err == nil {
			extend()
		}
		return n, err
	})
}

// readFunc is an io.Reader calling f.
type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

// writeBuild answers a build request with its state: 200 when the
// template is done (built or found), 202 while it is queued or running,
// Location naming where to follow it.
func writeBuild(w http.ResponseWriter, st apitype.TemplateBuild) error {
	code := http.StatusAccepted
	if st.State == apitype.BuildDone {
		code = http.StatusOK
	}
	w.Header().Set("Location", "/v1/templates/builds/"+st.Name)
	return writeJSON(w, code, st)
}
