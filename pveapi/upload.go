package pveapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"
)

// Upload is a file a storage takes over the API (POST
// /nodes/{node}/storage/{storage}/upload, pve-storage
// API2/Storage/Status.pm upload: Datastore.AllocateTemplate on the
// storage).
type Upload struct {
	// Content is "import" (.ova, .qcow2, .raw, .vmdk), "iso" or "vztmpl".
	Content string
	// Filename is the file's name in the storage's directory for Content:
	// already as normalize_content_filename leaves it (no path, only
	// [a-zA-Z0-9_.-]), so that the volume is the one asked for.
	Filename string
	// Size is the file's exact length in bytes (the request's
	// Content-Length: pve-http-server takes no upload without one).
	Size int64
	// Checksum and ChecksumAlgorithm have Proxmox verify the file before
	// it keeps it: the imgcopy task fails "checksum mismatch: got 'X' !=
	// expect 'Y'" and copies nothing. Both or neither.
	Checksum, ChecksumAlgorithm string
}

// reUploadSum is a hex digest as the checksum parameter takes it.
var reUploadSum = regexp.MustCompile(`^[0-9a-fA-F]{32,128}$`)

func (u Upload) validate(storage string) error {
	switch {
	case u.Content != "import" && u.Content != "iso" && u.Content != "vztmpl":
		return fmt.Errorf("upload to %s: content %q: want import, iso or vztmpl", storage, u.Content)
	case u.Filename == "" || NormalizeContentFilename(u.Filename) != u.Filename || u.Filename == "." || u.Filename == "..":
		return fmt.Errorf("upload to %s: filename %q: want a file name of [a-zA-Z0-9_.-] only (Proxmox would store another name)", storage, u.Filename)
	case u.Size <= 0:
		return fmt.Errorf("upload %s to %s: size %d: want the file's length in bytes", u.Filename, storage, u.Size)
	case (u.Checksum == "") != (u.ChecksumAlgorithm == ""):
		return fmt.Errorf("upload %s to %s: a checksum goes with its algorithm", u.Filename, storage)
	case u.Checksum != "" && !reUploadSum.MatchString(u.Checksum):
		return fmt.Errorf("upload %s to %s: checksum %q is not a hex digest", u.Filename, storage, u.Checksum)
	}
	return nil
}

// ErrShortUpload is a body that ended before the upload's Size.
var ErrShortUpload = errors.New("the file ended before its size")

// UploadFile streams body, Size bytes, to storage as a multipart upload
// (the form fields content, checksum-algorithm and checksum before the
// file part "filename", the order pve-http-server's
// file_upload_multipart reads them) and waits for the imgcopy task that
// verifies and copies it (its timeout is Options.TaskTimeout). Nothing is
// buffered: the body goes to Proxmox as it is read, and ctx ending stops
// the read. A file of the name already there is overwritten (the worker
// copies with cp). It returns the volume id (storage:CONTENT/FILE).
func (c *Client) UploadFile(ctx context.Context, storage string, u Upload, body io.Reader) (string, error) {
	if err := u.validate(storage); err != nil {
		return "", err
	}
	op := "upload " + u.Filename + " to " + storage
	// Checked first (and a ticket's session made: the upload itself logs
	// in no one): the worker's refusal would come only after the whole
	// file was sent.
	sc, err := c.Storage(ctx, storage)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	if !sc.Has(u.Content) {
		return "", fmt.Errorf("%s: storage %s does not take content %s (content %s): add it as root with pvesm set %s --content %s,%s",
			op, storage, u.Content, strings.Join(sc.Content, ","), storage, strings.Join(sc.Content, ","), u.Content)
	}
	fields := map[string]string{"content": u.Content}
	if u.Checksum != "" {
		fields["checksum-algorithm"], fields["checksum"] = u.ChecksumAlgorithm, strings.ToLower(u.Checksum)
	}
	src := &sizedReader{ctx: ctx, r: body, left: u.Size}
	p := fmt.Sprintf("/nodes/%s/storage/%s/upload", url.PathEscape(c.node), url.PathEscape(storage))
	var upid any
	err = c.c.UploadReader(p, fields, u.Filename, src, u.Size, &upid)
	if src.err != nil {
		// the body's own failure (short, cancelled) says more than the
		// transport's
		return "", fmt.Errorf("%s: %w", op, src.err)
	}
	if err != nil {
		return "", classify(op, err)
	}
	s, ok := upid.(string)
	if !ok || !strings.HasPrefix(s, "UPID:") {
		return "", fmt.Errorf("%s: answer %v is not a task", op, upid)
	}
	if err := c.wait(ctx, op, s, nil); err != nil {
		return "", err
	}
	return storage + ":" + u.Content + "/" + u.Filename, nil
}

// sizedReader reads exactly left bytes of r: a shorter r fails with
// ErrShortUpload, a longer one is cut at the size; ctx ending fails the
// next read. err keeps the first failure of r or ctx.
type sizedReader struct {
	ctx  context.Context
	r    io.Reader
	left int64
	err  error
}

func (s *sizedReader) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.left == 0 {
		return 0, io.EOF
	}
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return 0, err
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= int64(n)
	switch {
	case err == io.EOF && s.left > 0:
		s.err = fmt.Errorf("%w (%d bytes missing)", ErrShortUpload, s.left)
		return n, s.err
	case err == io.EOF:
		return n, io.EOF
	case err != nil:
		s.err = err
		return n, err
	}
	return n, nil
}
