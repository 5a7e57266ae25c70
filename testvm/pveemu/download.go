package pveemu

import (
	"compress/bzip2"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// NodeDialer is a Backend that opens connections from its node's network
// (the bed's node namespace), the way a download by the node's wget
// reaches the network. Without one the emulator dials from its own.
type NodeDialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// downloadURL is POST /nodes/{node}/storage/{storage}/download-url
// (pve-storage API2/Storage/Status.pm download_url): the schema's check
// (Datastore.AllocateTemplate on the storage and Sys.Audit+Sys.Modify on
// / or Sys.AccessNetwork on the node) ran before; here the storage's
// checks, the file name's normalisation and extension, then a "download"
// worker whose id is the encoded file name (download_fileFromURL).
func (s *Server) downloadURL(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	storage, content := rq.str("storage"), rq.str("content")
	s.mu.Lock()
	exists := s.storages[storage]
	configured := contentSet(s.storageContentLocked(storage, defaultContent(storage)))
	s.mu.Unlock()
	if !exists {
		return nil, fail("storage '%s' does not exist", storage)
	}
	if storage != dirStorage {
		return nil, fail("can't upload to storage type 'lvmthin', not a file based storage!")
	}
	if !configured[content] {
		return nil, fail("storage '%s' is not configured for content-type '%s'", storage, content)
	}
	filename := normalizeContentFilename(rq.str("filename"))
	var importFormat string
	switch content {
	case "iso":
		if !reISOFile.MatchString(filename) {
			return nil, paramFail(ParamErrors{"filename": "wrong file extension"})
		}
	case "vztmpl":
		if !reVztmplFile.MatchString(filename) {
			return nil, paramFail(ParamErrors{"filename": "wrong file extension"})
		}
	case "import":
		m := reImportFile.FindStringSubmatch(filename)
		if m == nil {
			return nil, paramFail(ParamErrors{"filename": "invalid filename or wrong extension"})
		}
		importFormat = m[1]
	default:
		return nil, paramFail(ParamErrors{"content": fmt.Sprintf("upload content-type '%s' is not allowed", content)})
	}
	d := &download{
		url: rq.str("url"), dest: filepath.Join(s.storageDir(), vtypeSubdir[content], filename),
		content: content, importFormat: importFormat, compression: rq.str("compression"),
		algorithm: rq.str("checksum-algorithm"), checksum: rq.str("checksum"),
		verify: rq.bool("verify-certificates", true), dial: s.nodeDialer(rq.str("node")),
	}
	s.mu.Lock()
	d.checksumHeld = s.hooks.checksumHeld
	s.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(d.dest), 0o755); err != nil {
		return nil, fail("%v", err)
	}
	return s.startStoppableTask(rq, "download", encodeText(filename), func(ctx context.Context, t *task) error {
		return d.run(ctx, t, s.reportedPath)
	}), nil
}

// defaultContent is a storage's content list as a fresh node has it.
func defaultContent(storage string) string {
	if storage == thinStorage {
		return "images,rootdir"
	}
	return "backup,iso,vztmpl"
}

// contentSet is a storage.cfg content list as a set.
func contentSet(list string) map[string]bool {
	out := map[string]bool{}
	for _, c := range strings.Split(list, ",") {
		out[strings.TrimSpace(c)] = true
	}
	return out
}

// nodeDialer is how node's wget connects: its backend's NodeDialer, or
// the emulator's own network.
func (s *Server) nodeDialer(node string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if nd, ok := s.nodeBackend(node).(NodeDialer); ok {
		return nd.DialContext
	}
	return (&net.Dialer{}).DialContext
}

// encodeText is pve-common ParseUtils.pm encode_text: every byte but
// 0x20-0x24, 0x26-0x39 and 0x3b-0x7e percent-encoded (':' and '%' too),
// so a task id holds no ':'.
func encodeText(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 0x20 && c <= 0x7e && c != '%' && c != ':' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// download is one download_url worker's job.
type download struct {
	url, dest    string
	content      string
	importFormat string // the import volume's format by its extension ("ova": an OVA)
	compression  string
	algorithm    string
	checksum     string
	verify       bool
	dial         func(ctx context.Context, network, addr string) (net.Conn, error)
	// checksumHeld, when set, holds the checksum step
	// (HoldDownloadChecksums).
	checksumHeld func(ctx context.Context, tmp string)
}

// run is the worker: pve-common Tools.pm download_file_from_url with
// download_url's options (hash_required when a checksum is given, the
// decompressor for an ISO, assert_file_validity). The file is fetched to
// "<dest>.tmp_dwnl.<pid>" and renamed into place only once it is
// verified; an existing file is checked before the download only, so two
// downloads of one name that both start before either ends both succeed
// and the last rename wins, as in the source.
func (d *download) run(ctx context.Context, t *task, reported func(string) string) error {
	if d.compression != "" {
		if d.content != "iso" {
			return fmt.Errorf("decompression not supported for %s", d.content)
		}
		switch d.compression {
		case "gz", "lzo", "zst", "bz2":
		default:
			return errors.New("no decompression method found")
		}
	}
	t.logf("downloading %s to %s", d.url, reported(d.dest))
	if st, err := os.Stat(d.dest); err == nil && st.Mode().IsRegular() {
		if d.algorithm == "" {
			return fmt.Errorf("refusing to override existing file '%s'", reported(d.dest))
		}
		t.print("calculating checksum of existing file...")
		got, err := fileHashInterruptible(ctx, d.algorithm, d.dest)
		if err != nil {
			// the die ends the open line (the task's exit status then
			// "unexpected status", as read_status reads it)
			return err
		}
		if strings.EqualFold(got, d.checksum) {
			t.logf("OK, got correct file already, no need to download")
			return nil
		}
		t.logf("") // print "\n" before the die
		return fmt.Errorf("checksum mismatch: got '%s' != expect '%s', aborting", got, d.checksum)
	}
	tmp := fmt.Sprintf("%s.tmp_dwnl.%d", d.dest, t.pid)
	tmpDecomp := fmt.Sprintf("%s.tmp_dcom.%d", d.dest, t.pid)
	err := d.fetchVerified(ctx, t, tmp, tmpDecomp, reported)
	if err != nil {
		_ = os.Remove(tmp)
		_ = os.Remove(tmpDecomp)
		return err
	}
	t.logf("download of '%s' to '%s' finished", d.url, reported(d.dest))
	return nil
}

// fetchVerified downloads to tmp, checks the checksum, decompresses,
// asserts the file's validity and renames it to dest.
func (d *download) fetchVerified(ctx context.Context, t *task, tmp, tmpDecomp string, reported func(string) string) error {
	if err := d.fetch(ctx, tmp); err != nil {
		return err
	}
	if d.algorithm != "" {
		if d.checksumHeld != nil {
			d.checksumHeld(ctx, tmp)
		}
		t.print("calculating checksum...")
		got, err := fileHashInterruptible(ctx, d.algorithm, tmp)
		if err != nil {
			// the die ends the open line: a stop here leaves the log's
			// last line "calculating checksum...TASK ERROR: received
			// interrupt", which read_status answers "unexpected status"
			return err
		}
		if !strings.EqualFold(got, d.checksum) {
			t.logf("") // print "\n" before the die
			return fmt.Errorf("checksum mismatch: got '%s' != expect '%s'", got, d.checksum)
		}
		t.logf("OK, checksum verified")
	}
	file := tmp
	if d.compression != "" {
		t.logf("decompressing %s to %s", reported(tmp), reported(tmpDecomp))
		if err := decompressFile(d.compression, tmp, tmpDecomp); err != nil {
			return err
		}
		_ = os.Remove(tmp)
		file = tmpDecomp
	}
	if err := d.assertValid(file, reported(file)); err != nil {
		return fmt.Errorf("failed to verify file: %w", err)
	}
	if err := os.Rename(file, d.dest); err != nil {
		return fmt.Errorf("unable to rename temporary file: %w", err)
	}
	return nil
}

// fetch is download_file_from_url's wget: the URL's body (redirects
// followed) written to tmp. A failure is run_command's "download failed:
// command '...' failed: exit code N" with wget's exit status (4 network
// failure, 5 TLS verification, 8 an error response).
func (d *download) fetch(ctx context.Context, tmp string) error {
	wget := "wget --progress=dot:giga -O " + tmp + " " + d.url
	if !d.verify {
		wget += " --no-check-certificate"
	}
	failed := func(code int) error {
		return fmt.Errorf("download failed: command '%s' failed: exit code %d", wget, code)
	}
	tr := &http.Transport{DialContext: d.dial, TLSClientConfig: &tls.Config{InsecureSkipVerify: !d.verify}} //nolint:gosec // verify-certificates=0 asks for it
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return failed(1)
	}
	// A stop (SIGTERM to the worker and its wget) ends the request: the
	// worker's die passes through run_command (PVE::Cmd run: "$errmsg:
	// $err") as "download failed: received interrupt".
	interrupted := func() error { return fmt.Errorf("download failed: %w", errInterrupted) }
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		var ue *url.Error
		var ce *tls.CertificateVerificationError
		if errors.As(err, &ue) && errors.As(err, &ce) {
			return failed(5)
		}
		return failed(4)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return failed(8)
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return failed(3)
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		return failed(4)
	}
	return nil
}

// assertValid is download_url's assert_file_validity: an ISO has no
// backing image (assert_iso_content: file_size_info auto-detected,
// untrusted), an OVA is a tar with an .ovf, another import image is in
// the format its extension names, without backing file.
func (d *download) assertValid(path, shown string) error {
	if d.content == "iso" {
		if _, err := probeImageAs(path, "", shown); err != nil {
			return err
		}
	}
	switch {
	case d.importFormat == "ova":
		return assertOVAContents(path)
	case d.importFormat != "":
		_, err := probeImageAs(path, d.importFormat, shown)
		return err
	}
	return nil
}

// fileHash is pve-common Tools.pm get_file_hash: the hex digest.
func fileHash(algorithm, path string) (string, error) {
	return fileHashInterruptible(context.Background(), algorithm, path)
}

// fileHashInterruptible is fileHash in a worker that a stop may
// interrupt: a stop (ctx's end) while it reads dies errInterrupted, the
// worker's SIGTERM handler's die (pve-common RESTEnvironment.pm
// fork_worker), which download_file_from_url's eval catches to remove
// its temporary files and die again with.
func fileHashInterruptible(ctx context.Context, algorithm, path string) (string, error) {
	var h hash.Hash
	switch algorithm {
	case "md5":
		h = md5.New() //nolint:gosec // the algorithm the caller asked for
	case "sha1":
		h = sha1.New() //nolint:gosec // the algorithm the caller asked for
	case "sha224":
		h = sha256.New224()
	case "sha256":
		h = sha256.New()
	case "sha384":
		h = sha512.New384()
	case "sha512":
		h = sha512.New()
	default:
		return "", fmt.Errorf("unknown checksum algorithm '%s'", algorithm)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if ctx.Err() != nil {
			return "", errInterrupted
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// HoldDownloadChecksums holds every download-url worker that begins its
// checksum step (its file fetched to tmp) until release, or until the
// task is stopped (which then interrupts the step); held receives each
// held worker's temporary file.
func (s *Server) HoldDownloadChecksums() (held <-chan string, release func()) {
	ch := make(chan string, 16)
	gate := make(chan struct{})
	var once sync.Once
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.checksumHeld = func(ctx context.Context, tmp string) {
		select {
		case ch <- tmp:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return ch, func() { once.Do(func() { close(gate) }) }
}

// decompressFile is the ISO decompressor of pve-storage Storage.pm
// decompressor_info (zcat, zstd -d, bzcat) writing src's content to dst;
// lzop is not emulated.
func decompressFile(compression, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var r io.Reader
	cmd := map[string]string{"gz": "zcat", "zst": "zstd -q -d -c", "bz2": "bzcat -q", "lzo": "lzop -d -c"}[compression]
	switch compression {
	case "gz":
		zr, err := gzip.NewReader(in)
		if err != nil {
			return fmt.Errorf("command '%s %s' failed: exit code 1", cmd, src)
		}
		r = zr
	case "zst":
		zr, err := zstd.NewReader(in)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	case "bz2":
		r = bzip2.NewReader(in)
	default:
		return fmt.Errorf("emulator: %s decompression is not emulated", compression)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("cant open temporary file %s for decompresson: %w", dst, err)
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("command '%s %s' failed: exit code 1", cmd, src)
	}
	return nil
}
