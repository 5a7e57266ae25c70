package pveemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// maxPost is pve-http-server's $limit_max_post: a request body other than
// an upload may be 512 KiB; a larger Content-Length is answered 501 "for
// data too large" before the body is read.
const maxPost = 512 * 1024

// errTooLarge is that answer; pve-http-server's error writes the message
// as the body.
var errTooLarge = &apiError{code: http.StatusNotImplemented, msg: "for data too large", text: true}

// uploadDir is where pve-http-server's get_upload_filename puts uploads.
const uploadDir = "/var/tmp"

// reUploadPath is the path pve-manager's HTTPServer.pm auth_handler treats
// as an upload (isUpload): the body is streamed to a temporary file.
var reUploadPath = regexp.MustCompile(`^/nodes/([^/]+)/storage/([^/]+)/upload$`)

// The volume names of a directory storage, from pve-storage Storage.pm
// ($ISO_EXT_RE_0, $VZTMPL_EXT_RE_1, $SAFE_CHAR_WITH_WHITESPACE_CLASS_RE,
// $IMPORT_EXT_RE_1, $OVA_CONTENT_RE_1; the backup extensions reduced to
// the archive suffixes vzdump writes).
var (
	reISOVol      = regexp.MustCompile(`^iso/([^/]+\.(?i:iso|img))$`)
	reVztmplVol   = regexp.MustCompile(`^vztmpl/([^/]+\.(?i:tar|tar\.(?:gz|xz|zst|bz2)))$`)
	reBackupVol   = regexp.MustCompile(`^backup/([^/]+\.(?:tgz|(?:tar|vma)(?:\.(?:gz|lzo|zst|bz2))?))$`)
	reSnippetsVol = regexp.MustCompile(`^snippets/([^/]+)$`)
	reImportVol   = regexp.MustCompile(`^import/([ a-zA-Z0-9\-.+=_]+(?:\.ova/[ a-zA-Z0-9\-.+=_]+\.(?:qcow2|raw|vmdk)|\.(?:ova|ovf|qcow2|raw|vmdk)))$`)
)

// vtypeSubdir is pve-storage Plugin.pm $vtype_subdirs: where a dir storage
// keeps each content type.
var vtypeSubdir = map[string]string{"iso": "template/iso", "vztmpl": "template/cache", "backup": "dump", "snippets": "snippets", "import": "import"}

// dirVolume is a parsed volume name of the dir storage that is not a VM
// image: its content type and file.
type dirVolume struct {
	vtype, file string
}

// parseDirVolname is pve-storage Plugin.pm parse_volname for the content
// types other than images (those are volumePath's): iso/, vztmpl/,
// backup/, snippets/, import/. ok is false when name is none of them.
func parseDirVolname(name string) (dirVolume, bool) {
	for _, c := range []struct {
		vtype string
		re    *regexp.Regexp
	}{{"iso", reISOVol}, {"vztmpl", reVztmplVol}, {"backup", reBackupVol}, {"snippets", reSnippetsVol}, {"import", reImportVol}} {
		if m := c.re.FindStringSubmatch(name); m != nil {
			return dirVolume{vtype: c.vtype, file: m[1]}, true
		}
	}
	return dirVolume{}, false
}

// dirVolumePath maps a volume id of the dir storage that is not a VM image
// to its file; the error is parse_volname's for a name of neither kind.
func (s *Server) dirVolumePath(storage, volume string) (volid, path string, ok bool, err error) {
	storage, name, err := splitVolume(storage, volume)
	if err != nil {
		return "", "", false, err
	}
	v, ok := parseDirVolname(name)
	if !ok {
		return "", "", false, nil
	}
	return storage + ":" + name, filepath.Join(s.storageDir(), vtypeSubdir[v.vtype], v.file), true, nil
}

// readUpload is pve-http-server's file_upload_multipart: the form fields
// content, checksum-algorithm and checksum, then the file part, which must
// be named "filename", streamed to /var/tmp/pveupload-<hex> (the schema's
// pattern of tmpfilename). The parameters are the query's and the form's,
// with tmpfilename set to the file.
func (s *Server) readUpload(r *http.Request) (map[string]any, error) {
	ct, p, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || ct != "multipart/form-data" || p["boundary"] == "" {
		return nil, fail("upload 'Content-Type '%s' not implemented", r.Header.Get("Content-Type"))
	}
	if r.ContentLength <= 0 {
		return nil, fail("upload without content length header not supported")
	}
	params := map[string]any{}
	for k, v := range decodeURLEncoded(r.URL.RawQuery) {
		params[k] = v
	}
	if _, ok := params["tmpfilename"]; ok {
		return nil, fail("'tmpfilename' query parameter is not allowed for file uploads")
	}
	mr := multipart.NewReader(r.Body, p["boundary"])
	for {
		part, err := mr.NextPart()
		if err != nil {
			return nil, fail("upload failed")
		}
		name := part.FormName()
		if part.FileName() == "" {
			v, err := io.ReadAll(io.LimitReader(part, 2048))
			if err != nil {
				return nil, fail("upload failed")
			}
			if name == "content" || name == "checksum-algorithm" || name == "checksum" {
				params[name] = strings.TrimSpace(string(v))
			}
			continue
		}
		if name != "filename" {
			return nil, fail("wrong field name '%s' for file upload, expected 'filename'", name)
		}
		params["filename"] = strings.TrimSpace(part.FileName())
		tmp, err := s.writeUploadFile(part)
		if err != nil {
			return nil, err
		}
		params["tmpfilename"] = tmp
		return params, nil
	}
}

// writeUploadFile streams the file part to a new temporary file.
func (s *Server) writeUploadFile(src io.Reader) (string, error) {
	name := filepath.Join(uploadDir, "pveupload-"+randomHex(16))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fail("unable to create temporary upload file '%s'", name)
	}
	_, err = io.Copy(f, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(name)
		return "", fail("write to temporary file failed - %v", err)
	}
	return name, nil
}

var reNotFilenameChar = regexp.MustCompile(`[^a-zA-Z0-9_.-]`)

// normalizeContentFilename is pve-storage Storage.pm
// normalize_content_filename.
func normalizeContentFilename(n string) string {
	n = strings.TrimSuffix(n, "\n")
	if i := strings.LastIndexAny(n, `/\`); i >= 0 {
		n = n[i+1:]
	}
	return reNotFilenameChar.ReplaceAllString(n, "_")
}

var (
	reISOFile    = regexp.MustCompile(`[^/]+\.(?i:iso|img)$`)
	reVztmplFile = regexp.MustCompile(`[^/]+\.(?i:tar|tar\.(?:gz|xz|zst|bz2))$`)
	reImportFile = regexp.MustCompile(`[a-zA-Z0-9\-.+=_]+\.(ova|qcow2|raw|vmdk)`)
)

// upload is POST /nodes/{node}/storage/{storage}/upload (pve-storage
// API2/Storage/Status.pm upload): the streamed temporary file is checked
// (its checksum when given, then as download_url checks a download) and
// copied into the storage's directory for the content type in an imgcopy
// task; an existing file is overwritten.
func (s *Server) upload(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	storage, content := rq.str("storage"), rq.str("content")
	tmp := rq.str("tmpfilename")
	if tmp == "" {
		return nil, fail("missing temporary file name")
	}
	st, err := os.Stat(tmp)
	if err != nil {
		return nil, fail("temporary file '%s' does not exist", tmp)
	}
	s.mu.Lock()
	exists := s.storages[storage]
	s.mu.Unlock()
	if !exists {
		_ = os.Remove(tmp)
		return nil, fail("storage '%s' does not exist", storage)
	}
	if storage != dirStorage {
		_ = os.Remove(tmp)
		return nil, fail("can't upload to storage type 'lvmthin'")
	}
	filename := normalizeContentFilename(rq.str("filename"))
	var ok bool
	switch content {
	case "iso":
		ok = reISOFile.MatchString(filename)
	case "vztmpl":
		ok = reVztmplFile.MatchString(filename)
	case "import":
		ok = reImportFile.MatchString(filename)
	}
	if !ok {
		_ = os.Remove(tmp)
		msg := "wrong file extension"
		if content == "import" {
			msg = "invalid filename or wrong extension"
		}
		return nil, paramFail(ParamErrors{"filename": msg})
	}
	s.mu.Lock()
	supported := strings.Contains(","+s.storageContentLocked(storage, "backup,iso,vztmpl")+",", ","+content+",")
	s.mu.Unlock()
	if !supported {
		_ = os.Remove(tmp)
		return nil, fail("storage '%s' does not support '%s' content", storage, content)
	}
	dest := filepath.Join(s.storageDir(), vtypeSubdir[content], filename)
	// The worker's checks before the copy are download_url's
	// assert_file_validity (assertValid): an ISO has no backing image, an
	// OVA has an .ovf, another import image is untrusted in the format its
	// extension names (file_size_info($tmpfilename, 10, $image_format, 1)).
	check := download{content: content}
	if content == "import" {
		if m := reImportFile.FindStringSubmatch(filename); m != nil {
			check.importFormat = m[1]
		}
	}
	alg, sum := rq.str("checksum-algorithm"), rq.str("checksum")
	return s.startTask(rq, "imgcopy", "", func(_ context.Context, t *task) error {
		defer os.Remove(tmp)
		t.logf("starting file import from: %s", tmp)
		if alg != "" {
			got, err := fileHash(alg, tmp)
			if err != nil {
				return err
			}
			if !strings.EqualFold(got, sum) {
				t.logf("calculating checksum...")
				return fmt.Errorf("checksum mismatch: got '%s' != expect '%s'", got, sum)
			}
			t.logf("calculating checksum...OK, checksum verified")
		}
		if err := check.assertValid(tmp, tmp); err != nil {
			return err
		}
		t.logf("target node: %s", s.node)
		t.logf("target file: %s", s.reportedPath(dest))
		t.logf("file size is: %d", st.Size())
		if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
			return fmt.Errorf("import failed: %w", err)
		}
		// NOTE (as the source): an existing file is overwritten.
		if err := copyFile(tmp, dest); err != nil {
			_ = os.Remove(dest)
			return fmt.Errorf("import failed: %w", err)
		}
		t.logf("finished file import successfully")
		return nil
	}), nil
}

// copyFile is the worker's `cp -- $tmpfilename $dest`: dst is opened
// truncated and written in place (no temporary file, no rename, no lock),
// so two uploads of one name at once write into the same file and a
// reader sees it half written; a failed copy unlinks dst ($err_cleanup),
// whoever wrote it.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// listDirContent lists the dir storage's files of content type vtype
// (iso, vztmpl, ...) as pve-storage Plugin.pm list_volumes does: volid,
// content, format, size, ctime.
func (s *Server) listDirContent(vtype string) ([]map[string]any, error) {
	files, err := os.ReadDir(filepath.Join(s.storageDir(), vtypeSubdir[vtype]))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fail("%v", err)
	}
	var out []map[string]any
	for _, f := range files {
		name := vtype + "/" + f.Name()
		if _, ok := parseDirVolname(name); !ok || !f.Type().IsRegular() {
			continue
		}
		info, err := f.Info()
		if err != nil {
			continue
		}
		ctime := info.ModTime().Unix()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			ctime = st.Ctim.Sec // list_volumes: ctime => $st->ctime
		}
		format := dirContentFormat(vtype, f.Name())
		out = append(out, map[string]any{"volid": dirStorage + ":" + name, "content": vtype, "format": format,
			"size": info.Size(), "ctime": ctime})
	}
	return out, nil
}

// dirContentFormat is the format Plugin.pm's get_subdir_files lists for a
// file of content type vtype: iso, the vztmpl's archive type (tar, tgz,
// txz, ...), the backup's compression or archive, snippet, the import's
// extension.
func dirContentFormat(vtype, name string) string {
	ext := name[strings.LastIndex(name, ".")+1:]
	switch vtype {
	case "iso":
		return "iso"
	case "vztmpl":
		if ext == "tar" {
			return "tar"
		}
		return "t" + ext
	case "snippets":
		return "snippet"
	case "backup":
		for _, a := range []string{".tgz", ".tar", ".vma"} {
			if i := strings.LastIndex(name, a); i >= 0 {
				return name[i+1:] // BACKUP_EXT_RE_2's whole extension
			}
		}
	case "import":
		return ext
	}
	return "raw"
}
