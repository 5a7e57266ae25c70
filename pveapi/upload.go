package pveapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
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
// the read and the wait for Proxmox's answer. A file of the name already there is overwritten (the worker
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
	src := &sizedReader{ctx: ctx, r: body, left: u.Size}
	req, err := c.uploadRequest(ctx, storage, u, src)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	var answer struct {
		Data any `json:"data"`
	}
	res, err := c.hc.Do(req)
	if err != nil {
		err = classify(op, err)
	} else {
		err = readEnvelope(op, res, &answer)
	}
	if ferr := src.failure(); ferr != nil {
		// the body's own failure (short, cancelled) says more than the
		// transport's
		return "", fmt.Errorf("%s: %w", op, ferr)
	}
	if err != nil {
		return "", err
	}
	s, ok := answer.Data.(string)
	if !ok || !strings.HasPrefix(s, "UPID:") {
		return "", fmt.Errorf("%s: answer %v is not a task", op, answer.Data)
	}
	if err := c.wait(ctx, op, s, nil); err != nil {
		return "", err
	}
	return storage + ":" + u.Content + "/" + u.Filename, nil
}

// uploadRequest is the upload's POST, bound to ctx (its end ends the
// call, the wait for Proxmox's answer after the body included: the
// client may have no timeout, and a file's copy may take long): a
// multipart form of the fields content, checksum-algorithm and checksum,
// in that order, then the file part "filename" with the body, the order
// pve-http-server's file_upload_multipart reads them. The form's framing
// is made ahead (its length with u.Size is the Content-Length Proxmox
// needs) and the body streamed between, as read.
func (c *Client) uploadRequest(ctx context.Context, storage string, u Upload, body io.Reader) (*http.Request, error) {
	var head bytes.Buffer
	mw := multipart.NewWriter(&head)
	fields := [][2]string{{"content", u.Content}}
	if u.Checksum != "" {
		fields = append(fields, [2]string{"checksum-algorithm", u.ChecksumAlgorithm}, [2]string{"checksum", strings.ToLower(u.Checksum)})
	}
	for _, f := range fields {
		if err := mw.WriteField(f[0], f[1]); err != nil {
			return nil, err
		}
	}
	if _, err := mw.CreateFormFile("filename", u.Filename); err != nil {
		return nil, err
	}
	n := head.Len()
	if err := mw.Close(); err != nil { // the closing boundary, after the file
		return nil, err
	}
	tail := bytes.Clone(head.Bytes()[n:])
	head.Truncate(n)
	p := fmt.Sprintf("%s/nodes/%s/storage/%s/upload", strings.TrimRight(c.o.URL, "/"), url.PathEscape(c.node), url.PathEscape(storage))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p, io.MultiReader(&head, body, bytes.NewReader(tail)))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(n) + u.Size + int64(len(tail))
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "pve-inspectd")
	if err := c.authorize(req); err != nil {
		return nil, err
	}
	return req, nil
}

// authorize sets req's credentials: the client's API token, or its
// session's ticket and CSRF token (a password client: the session made by
// a call before).
func (c *Client) authorize(req *http.Request) error {
	if c.o.Secret != "" {
		req.Header.Set("Authorization", "PVEAPIToken="+c.o.TokenID+"="+c.o.Secret)
		return nil
	}
	s := c.c.Session()
	if s == nil {
		return errors.New("no session: the client has not logged in")
	}
	req.Header.Set("Cookie", "PVEAuthCookie="+s.Ticket)
	req.Header.Set("CSRFPreventionToken", s.CSRFPreventionToken)
	return nil
}

// sizedReader reads exactly left bytes of r: a shorter r fails with
// ErrShortUpload, a longer one is cut at the size; ctx ending fails the
// next read. err keeps the first failure of r or ctx.
type sizedReader struct {
	ctx  context.Context
	r    io.Reader
	left int64 // the transport's (Read's caller's) alone
	// err is the body's own failure. Read runs on the transport's
	// goroutine, which may still be reading when Do has returned (an
	// early answer, a cancelled context), so it is set and read under mu.
	mu  sync.Mutex
	err error
}

// failure is the body's own failure, or nil.
func (s *sizedReader) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// fail records err as the body's failure (the first one stays) and
// returns it.
func (s *sizedReader) fail(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	return s.err
}

func (s *sizedReader) Read(p []byte) (int, error) {
	if err := s.failure(); err != nil {
		return 0, err
	}
	if s.left == 0 {
		return 0, io.EOF
	}
	if err := s.ctx.Err(); err != nil {
		return 0, s.fail(err)
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= int64(n)
	switch {
	case err == io.EOF && s.left > 0:
		return n, s.fail(fmt.Errorf("%w (%d bytes missing)", ErrShortUpload, s.left))
	case err == io.EOF:
		return n, io.EOF
	case err != nil:
		return n, s.fail(err)
	}
	return n, nil
}
