package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Uploader is the builder's client's upload (pveapi.Client.UploadFile:
// POST .../storage/{storage}/upload, Datastore.AllocateTemplate on the
// storage) and the storage's room (StorageStatus: GET
// .../storage/{storage}/status, Datastore.Audit or
// Datastore.AllocateSpace).
type Uploader interface {
	UploadFile(ctx context.Context, storage string, u pveapi.Upload, body io.Reader) (string, error)
	StorageStatus(ctx context.Context, storage string) (pveapi.StorageStatus, error)
}

// UploadBody opens an upload's body when the upload needs it: the
// reader, and release to call once done with it (the caller's upload
// slot), or a refusal (the node's uploads in flight are full) that Upload
// returns as it is, nothing changed.
type UploadBody = func() (body io.Reader, release func(), err error)

// uploadSpoolCopies is how many times an upload's size its image
// storage must have free: pve-http-server spools the body to
// /var/tmp/pveupload-* (AnyEvent.pm get_upload_filename,
// file_upload_multipart) and pve-storage's imgcopy worker copies that
// file into the storage's import directory with cp, removing the spool
// only after the copy (Status.pm upload): on a node whose /var/tmp and
// image storage share a file system (the default local storage,
// /var/lib/vz) both are there at once.
const uploadSpoolCopies = 2

// UploadFile is the file an uploaded image is stored as in the image
// storage's import directory: the build's own name of its digest
// (BuildFile), so that a file another user put there under the upload's
// name is never taken, and one of the digest's name is checked.
func UploadFile(file, sha256 string) string { return BuildFile("", file, sha256) }

// uploadRequest checks u and returns the build request it stands for
// (its identity for joins) and the image it builds from.
func (s *Service) uploadRequest(u apitype.TemplateUpload) (apitype.TemplateBuildRequest, Image, error) {
	if err := ValidName(u.Name); err != nil {
		return apitype.TemplateBuildRequest{}, Image{}, invalidField("name", err)
	}
	if !reImportFile.MatchString(u.File) || pveapi.NormalizeContentFilename(u.File) != u.File || len(u.File) > 128 {
		return apitype.TemplateBuildRequest{}, Image{}, badRequest("file", "%q: want the image's file name (letters, digits, '_', '.', '-'; at most 128 characters) ending .ova, .qcow2, .raw or .vmdk", u.File)
	}
	sum := strings.ToLower(u.SHA256)
	if len(sum) != 64 || !reHex.MatchString(sum) {
		return apitype.TemplateBuildRequest{}, Image{}, badRequest("sha256", "%q: want the image's sha256 digest, 64 hex digits", u.SHA256)
	}
	mode, err := uploadMode(u)
	if err != nil {
		return apitype.TemplateBuildRequest{}, Image{}, err
	}
	if !mode.ImportOnly && strings.HasSuffix(u.File, ".ova") != (u.OVADisk != "") {
		return apitype.TemplateBuildRequest{}, Image{}, badRequest("ova_disk", "an .ova names the disk inside it to import (ova_disk=DISK.vmdk), and only an .ova does (with import_only=true every disk of the OVA is imported)")
	}
	if u.OVADisk != "" && !reOVADisk.MatchString(u.OVADisk) {
		return apitype.TemplateBuildRequest{}, Image{}, badRequest("ova_disk", "%q: not a disk file name (.vmdk, .qcow2, .raw)", u.OVADisk)
	}
	if u.Size < 1 || u.Size > s.o.MaxUpload {
		return apitype.TemplateBuildRequest{}, Image{}, badRequest("size", "%d bytes (the body's Content-Length): want 1 to %d ([templates] max_upload_gib)", u.Size, s.o.MaxUpload)
	}
	storage := s.o.Defaults.ImageStorage
	img := Image{Volume: storage + ":import/" + UploadFile(u.File, sum), File: u.File, Disk: u.OVADisk, Checksum: "sha256:" + sum}
	req := apitype.TemplateBuildRequest{Name: u.Name, From: apitype.UploadSource + u.File, Checksum: img.Checksum, OVADisk: u.OVADisk, BuildMode: apitype.BuildMode(mode)}
	return req, img, nil
}

// Upload builds template u.Name from the image body (u.Size bytes): it
// joins a build of the same upload that is queued or running, or answers
// that the template exists (done, reused), without opening body (no
// upload slot taken). Else it opens body (a refusal is returned as it
// is, nothing changed) and sends it to the node's image storage, which
// must have room for it twice beyond what the uploads in flight hold
// (roomHolds, uploadSpoolCopies: else an error wrapping
// sandbox.ErrStorageFull naming the storage, the need and what is free,
// before a byte is read), Proxmox verifying its sha256; a file of the
// digest's name already there with that digest is taken and body not
// read. Then it starts the build, as one of a volume on the node: Upload
// returns once the image is on the node, the build queued. A request
// refused as asked is a *sandbox.InvalidError (the field named), nothing
// changed.
func (s *Service) Upload(ctx context.Context, u apitype.TemplateUpload, open UploadBody) (apitype.TemplateBuild, error) {
	req, img, err := s.uploadRequest(u)
	if err != nil {
		return apitype.TemplateBuild{}, err
	}
	st, px, done, err := s.joinOrFind(ctx, req, "")
	if done || err != nil {
		return st, err
	}
	up, ok := px.(Uploader)
	if !ok {
		return apitype.TemplateBuild{}, errors.New("template upload: the builder's client cannot upload")
	}
	body, release, err := open()
	if err != nil {
		return apitype.TemplateBuild{}, err
	}
	defer release()
	_, file, _ := strings.Cut(img.Volume, ":import/")
	b, joined, err := s.registerUpload(req, file)
	if err != nil || b == nil {
		return joined, err
	}
	err = s.put(ctx, px, up, b, img, u, body)
	s.mu.Lock()
	delete(s.uploading, file)
	s.mu.Unlock()
	if err != nil {
		s.end(b, Result{}, err)
		return apitype.TemplateBuild{}, err
	}
	return s.startRegistered(b, Generic(img))
}

// registerUpload registers the build of an upload of file (running: it
// uploads), refusing a second upload of the same file for another
// template while one runs (Proxmox's upload copies over the file in
// place, with no lock: two at once would each see the other's half).
func (s *Service) registerUpload(req apitype.TemplateBuildRequest, file string) (*build, apitype.TemplateBuild, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.uploading[file] {
		return nil, apitype.TemplateBuild{}, fmt.Errorf("%w: the image %s is being uploaded for another template; retry when that upload is done", ErrBuildConflict, file)
	}
	b, joined, err := s.registerLocked(req)
	if err != nil || b == nil {
		return nil, joined, err
	}
	b.state.State = apitype.BuildRunning
	s.uploading[file] = true
	return b, apitype.TemplateBuild{}, nil
}

// startRegistered starts the goroutine of build b, registered by
// registerUpload.
func (s *Service) startRegistered(b *build, recipe Recipe) (apitype.TemplateBuild, error) {
	s.mu.Lock()
	if s.ctx == nil {
		s.mu.Unlock()
		s.end(b, Result{}, ErrNotRunning)
		return apitype.TemplateBuild{}, ErrNotRunning
	}
	b.state.State = apitype.BuildQueued
	s.wg.Add(1)
	go s.run(s.ctx, b, recipe)
	st := b.snapshot()
	s.mu.Unlock()
	return st, nil
}

// put makes sure img's file is on the node: taken when a file of its
// name has its digest, else uploaded from body.
func (s *Service) put(ctx context.Context, px Proxmox, up Uploader, b *build, img Image, u apitype.TemplateUpload, body io.Reader) error {
	w := progressWriter{s: s, b: b}
	storage, file, _ := strings.Cut(img.Volume, ":import/")
	_, sum, _ := strings.Cut(img.Checksum, ":")
	vols, err := px.StorageVolumes(ctx, storage, "import")
	if err != nil {
		return err
	}
	if slices.ContainsFunc(vols, func(v pveapi.StorageVolume) bool { return v.VolID == img.Volume }) {
		p, err := px.VolumePath(ctx, img.Volume)
		if err != nil {
			return err
		}
		got, err := s.o.Host.Checksum(p, "sha256")
		if err != nil {
			return fmt.Errorf("checksum of %s: %w", p, err)
		}
		if got == sum {
			fmt.Fprintf(w, "%-8s %s is on the node already with sha256 %s: not uploaded again\n", "upload:", img.Volume, sum)
			return nil
		}
		fmt.Fprintf(w, "%-8s %s is on the node with another digest (sha256 %s): replaced by the upload\n", "upload:", img.Volume, got)
	}
	release, err := s.room.hold(ctx, up, storage, u.File, u.Size)
	if err != nil {
		return err
	}
	defer release()
	fmt.Fprintf(w, "%-8s %s (%d bytes) to %s (Proxmox verifies its sha256)\n", "upload:", u.File, u.Size, img.Volume)
	_, err = up.UploadFile(ctx, storage, pveapi.Upload{Content: "import", Filename: file, Size: u.Size, Checksum: sum, ChecksumAlgorithm: "sha256"}, body)
	if err != nil && strings.Contains(err.Error(), "checksum mismatch") {
		return badRequest("sha256", "the image sent is not the one of sha256 %s (Proxmox's check: %v): nothing kept", sum, err)
	}
	return err
}
