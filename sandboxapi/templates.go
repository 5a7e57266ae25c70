package sandboxapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
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
	// Upload builds from the image body, u.Size bytes
	// (templatebuild.Service.Upload): it joins or answers an existing
	// template without calling open; else it calls open once for the body
	// (which takes an upload slot, or refuses: returned as it is) and
	// calls the release it gives when done with it.
	Upload(ctx context.Context, u apitype.TemplateUpload, open func() (body io.Reader, release func(), err error)) (apitype.TemplateBuild, error)
}

// TemplateCatalog answers GET /v1/templates/{name}
// (templatebuild.Catalog): the VM template a create of the name clones
// and what the node's build ledger records of it (false: none). Its
// answers cost the node at most one look per its own interval, whatever
// the rate of questions.
type TemplateCatalog interface {
	Template(ctx context.Context, name string) (apitype.TemplateInfo, bool, error)
}

// uploadTimeout bounds an image upload (the body's transfer to the node
// and Proxmox's check of it).
func uploadTimeout(s *Server) time.Duration { return s.o.TemplateUploadTimeout }

// maxUploads is how many image uploads the node takes at once: each holds
// a connection and streams gigabytes to the node's image storage (the
// disk, pveproxy's temporary file, Proxmox's copy). Only an upload whose
// body is needed takes one (not one answered done or joined without
// reading it); one past it is refused before its body is read, 429 with
// Retry-After (quota image-uploads): the client tries again.
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
	pTemplate   = param{name: "name", in: "path", desc: "template name", required: true}
	pImageFile  = param{name: "file", in: "query", desc: "the image's file name: .ova, .qcow2, .raw or .vmdk", required: true}
	pImageSum   = param{name: "sha256", in: "query", desc: "the image's sha256 digest (64 hex digits): Proxmox verifies the upload against it", required: true}
	pOVADisk    = param{name: "ova_disk", in: "query", desc: "for an .ova built booted, the disk inside it to import (DISK.vmdk); only for an .ova, and not with import_only"}
	pImportOnly = param{name: "import_only", in: "query", desc: "true: build without boot, the image as it is (every disk of an .ova, as Proxmox's import-metadata lists them; no cloud-init, no guest agent installed, " +
		"nothing reset in the guest: every clone is identical, and a sandbox VM of it needs the agent in the image). Part of the build's identity: a template of the name built the other way is a 409",
		schema: func() map[string]any { return map[string]any{"type": "string", "enum": []string{"", "true", "false"}} }}
	pDiskBus = param{name: "disk_bus", in: "query", desc: "with import_only: the bus of every imported disk, scsi (virtio-scsi, the default), ide or sata (emulated ATA, for images without virtio drivers; qemu-server takes 31, 4 and 6 disks)",
		schema: func() map[string]any {
			return map[string]any{"type": "string", "enum": []string{"", "scsi", "ide", "sata"}}
		}}
	pOSType = param{name: "os_type", in: "query", desc: "with import_only: the template's ostype, l26 (the default), win10 or win11",
		schema: func() map[string]any {
			return map[string]any{"type": "string", "enum": append([]string{""}, hardening.OSTypes...)}
		}}
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
		{method: "GET", path: "/v1/templates/{name}", scope: apitype.ScopeRead,
			summary:  "The VM template a create naming it clones on this node: its vmid, whether the node's template builds made it (built), and image, the digest of the image it was built from (sha256:HEX) when the node's build ledger records it (with import_only, disk_bus and os_type for one imported without boot), for a client that finds a template by name to compare with its own image. Every token of the node may ask, owner-bound ones and nodes without builds too: an operator's image digest is visible to every tenant of the node (it names no owner)",
			response: "TemplateInfo", okStatus: http.StatusOK, params: []param{pTemplate}, timeout: reqTimeout, h: s.getTemplate},
		{method: "PUT", path: "/v1/templates/build/{name}/image", scope: apitype.ScopeAdmin, node: true,
			summary: "Build a template from an image sent as the body (Content-Length required, at most [templates] max_upload_gib): the daemon streams it to the node's image storage as a file of its digest's name, Proxmox verifies its sha256, and the build runs as one from a volume on the node. " +
				"A template of the name that exists answers 200 (done, reused), a running build of the same upload 202 (joined), both without reading the body or taking an upload slot; an image storage with less free than twice the body's length, beyond what the uploads to it in flight hold, 507; 202: the image is on the node and the build queued. A node operation, as POST /v1/templates/build",
			requestType: "application/octet-stream", response: "TemplateBuild", okStatus: http.StatusAccepted,
			params: []param{pTemplate, pImageFile, pImageSum, pOVADisk, pImportOnly, pDiskBus, pOSType}, timeout: uploadTimeout, h: s.uploadTemplateImage},
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
	q := r.URL.Query()
	u := apitype.TemplateUpload{Name: r.PathValue("name"), File: q.Get("file"), SHA256: q.Get("sha256"), OVADisk: q.Get("ova_disk"), Size: r.ContentLength,
		BuildMode: apitype.BuildMode{DiskBus: q.Get("disk_bus"), OSType: q.Get("os_type")}}
	switch v := q.Get("import_only"); v {
	case "true":
		u.ImportOnly = true
	case "", "false":
	default:
		w.Header().Set("Connection", "close") // the body is not read
		return &sandbox.InvalidError{Field: "import_only", Msg: fmt.Sprintf("import_only: %q: want true or false", v)}
	}
	// the body, with an upload slot, only when the builder needs it (an
	// answer without it, done or joined, takes no slot)
	open := func() (io.Reader, func(), error) {
		release, err := s.takeUpload()
		if err != nil {
			return nil, nil, err
		}
		return s.idleBody(w, http.MaxBytesReader(w, r.Body, max(r.ContentLength, 1))), release, nil
	}
	st, err := s.o.Templates.Upload(r.Context(), u, open)
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

// getTemplate answers GET /v1/templates/{name} from the catalog.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, _ principal) error {
	if s.o.TemplateCatalog == nil {
		return newProblem(apitype.ProblemUnavailable, "this daemon keeps no template catalog")
	}
	name := r.PathValue("name")
	t, ok, err := s.o.TemplateCatalog.Template(r.Context(), name)
	if err != nil {
		return err
	}
	if !ok {
		return problemf(apitype.ProblemNotFound, "no VM template %q on this node (POST /v1/sandboxes/validate lists the templates a create may name)", name)
	}
	return writeJSON(w, http.StatusOK, t)
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
	put[httpCode(http.StatusBadRequest)] = problemResponse("an invalid name, file, sha256, ova_disk, import_only, disk_bus or os_type (disk_bus and os_type go with import_only, ova_disk not), no Content-Length or one over [templates] max_upload_gib (field size), or a body whose sha256 is not the one given (field sha256): no template is built", apitype.ProblemInvalidRequest)
	put[httpCode(http.StatusConflict)] = problemResponse("a build of the name from another source or mode is queued or runs, the template of the name exists built from another image or the other way (booted, or imported without boot on another disk_bus or os_type), or the same image is being uploaded for another template", apitype.ProblemConflict)
	put[httpCode(http.StatusServiceUnavailable)] = problemResponse("the node's build queue is full, the daemon starts or stops, the builder cannot log in (its password file, its password), or the node's image storage is not active (pvesm status; the detail names it): the body is not read, nothing is built", apitype.ProblemUnavailable)
	tooMany := problemResponse(fmt.Sprintf("the node has as many image uploads in flight as it takes at once (%d; quota image-uploads): the body is not read; retry after Retry-After", maxUploads), apitype.ProblemTooManyRequests)
	tooMany["headers"] = retryAfterHeaders()
	put[httpCode(http.StatusTooManyRequests)] = tooMany
	put[httpCode(http.StatusInsufficientStorage)] = problemResponse("the node's image storage has less free than twice the body's length beyond what the uploads to it in flight hold (Proxmox spools an upload, then copies it into the storage): the detail names the storage, the need and what is free; the body is not read", apitype.ProblemInsufficientStorage)
	get := paths["/v1/templates/{name}"].(map[string]any)["get"].(map[string]any)["responses"].(map[string]any)
	get[httpCode(http.StatusNotFound)] = problemResponse("the node has no VM template a create of the name would clone", apitype.ProblemNotFound)
	get[httpCode(http.StatusServiceUnavailable)] = problemResponse("the node's build ledger cannot be read (this answer stands for up to 10 s: the node is looked at once per 10 s at most), or the daemon keeps no template catalog", apitype.ProblemUnavailable)
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
