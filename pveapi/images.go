package pveapi

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// The calls `pve-inspectd template build` makes to turn a cloud image into
// a template. They are an operator's: download-url lets its caller make
// the node fetch any URL (a probe of the node's own network), so Proxmox
// asks for Sys.AccessNetwork on the node (or Sys.Audit and Sys.Modify on
// /) beside Datastore.AllocateTemplate on the storage (pve-storage
// API2/Storage/Status.pm download_url). The daemon's sandbox token gets neither: the build runs with a
// user's ticket (NewWithPassword), like `template harden`.

// Download is a file for a storage to fetch (POST
// /nodes/{node}/storage/{storage}/download-url).
type Download struct {
	// URL is what the node downloads: http or https only (the API's url
	// pattern is https?://.*; ftp is refused).
	URL string
	// Content is "import" (disk images, OVAs), "iso" or "vztmpl".
	Content string
	// Filename is the file's name in the storage's directory for Content;
	// Proxmox stores it under NormalizeContentFilename's name and, for
	// import, wants .ova, .qcow2, .raw or .vmdk.
	Filename string
	// Checksum and ChecksumAlgorithm (md5, sha1, sha224, sha256, sha384,
	// sha512), when set, have Proxmox verify the downloaded file before it
	// keeps it (PVE::Tools download_file_from_url: a mismatch fails the
	// task and leaves no file). A file already there is never replaced:
	// with a checksum it is kept when it matches and fails the task
	// ("checksum mismatch: ... aborting") when not; without one the task
	// fails ("refusing to override existing file").
	Checksum, ChecksumAlgorithm string
	// InsecureTLS turns certificate verification off (verify-certificates=0).
	InsecureTLS bool
}

// reUnsafeFileChar is what normalize_content_filename replaces.
var reUnsafeFileChar = regexp.MustCompile(`[^a-zA-Z0-9_.-]`)

// NormalizeContentFilename is the name download-url and upload store a
// file under (pve-storage Storage.pm normalize_content_filename: the
// part after the last / or \, every character outside [a-zA-Z0-9_.-]
// made '_').
func NormalizeContentFilename(name string) string {
	name = strings.TrimSuffix(name, "\n")
	if i := strings.LastIndexAny(name, "/\\"); i >= 0 {
		name = name[i+1:]
	}
	return reUnsafeFileChar.ReplaceAllString(name, "_")
}

// DownloadURL has storage download d and waits for the task (its timeout
// is Options.TaskTimeout); a failed download's error carries the task's
// exit status (e.g. Proxmox's checksum mismatch). It returns the volume id
// (storage:CONTENT/FILE, FILE as Proxmox normalizes d.Filename). A ctx
// that ends before the task does, during the POST too, fails it with a
// *TaskUnfinishedError naming the task (startAndWait), for StopTask.
func (c *Client) DownloadURL(ctx context.Context, storage string, d Download) (string, error) {
	if d.URL == "" || d.Content == "" || d.Filename == "" {
		return "", fmt.Errorf("download to %s: url, content and filename are required", storage)
	}
	if u, err := url.Parse(d.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("download to %s: %q is not an http(s) URL", storage, d.URL)
	}
	if strings.ContainsAny(d.Filename, "/\\") {
		return "", fmt.Errorf("download to %s: filename %q has a path separator", storage, d.Filename)
	}
	body := map[string]any{"url": d.URL, "content": d.Content, "filename": d.Filename}
	if d.Checksum != "" {
		if d.ChecksumAlgorithm == "" {
			return "", fmt.Errorf("download %s: a checksum without its algorithm", d.Filename)
		}
		body["checksum"], body["checksum-algorithm"] = d.Checksum, d.ChecksumAlgorithm
	}
	if d.InsecureTLS {
		body["verify-certificates"] = 0
	}
	p := fmt.Sprintf("/nodes/%s/storage/%s/download-url", url.PathEscape(c.node), url.PathEscape(storage))
	if err := c.startAndWait(ctx, "download "+d.Filename+" to "+storage, p, body); err != nil {
		return "", err
	}
	return storage + ":" + d.Content + "/" + NormalizeContentFilename(d.Filename), nil
}

// StorageVolume is one volume of a storage's content listing.
type StorageVolume struct {
	VolID   string `json:"volid"`
	Content string `json:"content"`
	Format  string `json:"format"`
	Size    int64  `json:"size"`
	VMID    int    `json:"vmid"`
}

// StorageVolumes lists storage's volumes of content type content ("" for
// all) on this node (GET .../storage/{storage}/content: Datastore.Audit
// or Datastore.AllocateSpace on the storage).
func (c *Client) StorageVolumes(ctx context.Context, storage, content string) ([]StorageVolume, error) {
	q := ""
	if content != "" {
		q = "?content=" + url.QueryEscape(content)
	}
	var list []struct {
		VolID   string  `json:"volid"`
		Content string  `json:"content"`
		Format  string  `json:"format"`
		Size    flexInt `json:"size"`
		VMID    flexInt `json:"vmid"`
	}
	if err := c.c.Get(ctx, c.storageContent(storage)+q, &list); err != nil {
		return nil, classify("list content of "+storage, err)
	}
	out := make([]StorageVolume, len(list))
	for i, v := range list {
		out[i] = StorageVolume{VolID: v.VolID, Content: v.Content, Format: v.Format, Size: int64(v.Size), VMID: int(v.VMID)}
	}
	return out, nil
}

// StorageConfig is a storage's definition as GET /storage/{storage}
// returns it (pve-storage API2/Storage/Config.pm read).
type StorageConfig struct {
	ID   string
	Type string
	// Path is the base directory of a file-based storage ("" otherwise).
	Path string
	// Content are the content types the storage takes.
	Content []string
	// ContentDirs are the content-dirs overrides (content type to a
	// directory relative to Path).
	ContentDirs map[string]string
}

// Has reports whether the storage takes content type t.
func (s StorageConfig) Has(t string) bool {
	for _, c := range s.Content {
		if c == t {
			return true
		}
	}
	return false
}

// contentSubdirs are the default directories of each content type under a
// file-based storage's path (pve-storage Storage/Plugin.pm $vtype_subdirs).
var contentSubdirs = map[string]string{
	"images": "images", "rootdir": "private", "iso": "template/iso", "vztmpl": "template/cache",
	"backup": "dump", "snippets": "snippets", "import": "import",
}

// Dir is the node directory of content type t (Plugin.pm get_subdir: the
// content-dirs override or the default under Path).
func (s StorageConfig) Dir(t string) (string, error) {
	if s.Path == "" {
		return "", fmt.Errorf("storage %s (%s) is not file-based: it has no path", s.ID, s.Type)
	}
	sub, ok := s.ContentDirs[t]
	if !ok {
		if sub, ok = contentSubdirs[t]; !ok {
			return "", fmt.Errorf("storage %s: unknown content type %q", s.ID, t)
		}
	}
	return path.Join(s.Path, sub), nil
}

// StorageStatus is a storage's state on the node (GET
// /nodes/{node}/storage/{storage}/status).
type StorageStatus struct {
	// Active is false when the node cannot reach the storage (its sizes
	// are then 0).
	Active bool
	// Total, Used and Avail are bytes.
	Total, Used, Avail int64
}

// StorageStatus reads storage's state on the node: pve-storage
// API2/Storage/Status.pm read_status (Datastore.Audit or
// Datastore.AllocateSpace on /storage/{storage}), storage_info's entry,
// whose sizes a dir storage takes from df of its path (Plugin.pm status).
func (c *Client) StorageStatus(ctx context.Context, storage string) (StorageStatus, error) {
	var raw struct {
		Active flexInt `json:"active"`
		Total  flexInt `json:"total"`
		Used   flexInt `json:"used"`
		Avail  flexInt `json:"avail"`
	}
	p := fmt.Sprintf("/nodes/%s/storage/%s/status", url.PathEscape(c.node), url.PathEscape(storage))
	if err := c.c.Get(ctx, p, &raw); err != nil {
		return StorageStatus{}, classify("status of storage "+storage, err)
	}
	return StorageStatus{Active: raw.Active != 0, Total: int64(raw.Total), Used: int64(raw.Used), Avail: int64(raw.Avail)}, nil
}

// Storage reads storage's definition from GET /storage (pve-storage
// API2/Storage/Config.pm index: each storage.cfg section the caller has
// Datastore.Audit or Datastore.AllocateSpace on, as api_storage_config
// renders it, content and content-dirs as their config text).
func (c *Client) Storage(ctx context.Context, storage string) (StorageConfig, error) {
	var list []struct {
		Storage     string `json:"storage"`
		Type        string `json:"type"`
		Path        string `json:"path"`
		Content     string `json:"content"`
		ContentDirs string `json:"content-dirs"`
	}
	if err := c.c.Get(ctx, "/storage", &list); err != nil {
		return StorageConfig{}, classify("list storages", err)
	}
	for _, raw := range list {
		if raw.Storage != storage {
			continue
		}
		s := StorageConfig{ID: storage, Type: raw.Type, Path: raw.Path, ContentDirs: map[string]string{}}
		for _, t := range strings.Split(raw.Content, ",") {
			if t = strings.TrimSpace(t); t != "" {
				s.Content = append(s.Content, t)
			}
		}
		for _, d := range strings.Split(raw.ContentDirs, ",") {
			if t, dir, ok := strings.Cut(strings.TrimSpace(d), "="); ok {
				s.ContentDirs[t] = dir
			}
		}
		return s, nil
	}
	return StorageConfig{}, fmt.Errorf("storage %s: %w (or no Datastore.Audit on it)", storage, sandbox.ErrNotFound)
}

// CreateVM creates VM vmid with config conf (POST /nodes/{node}/qemu; a
// disk "STORAGE:0,import-from=VOLID" is imported from volume VOLID, which
// qemu-server converts into a new disk of the VM), and waits for the task.
func (c *Client) CreateVM(ctx context.Context, vmid int, conf map[string]string) error {
	body := map[string]any{"vmid": vmid}
	for k, v := range conf {
		if k == "vmid" || k == "node" {
			return fmt.Errorf("create %d: config key %q is not a config key", vmid, k)
		}
		body[k] = v
	}
	return c.call(ctx, "POST", fmt.Sprintf("create %d", vmid), "/nodes/"+url.PathEscape(c.node)+"/qemu", body)
}

// ShutdownVM asks the guest to power off (ACPI, or the guest agent with
// agent enabled) and waits up to timeout; with force the VM is stopped
// when the timeout passes (forceStop), otherwise the task fails.
func (c *Client) ShutdownVM(ctx context.Context, vmid int, timeout time.Duration, force bool) error {
	body := map[string]any{"timeout": max(int(timeout.Seconds()), 1)}
	if force {
		body["forceStop"] = 1
	}
	return c.call(ctx, "POST", fmt.Sprintf("shut down %d", vmid), c.qemu(vmid)+"/status/shutdown", body)
}

// ConvertToTemplate turns stopped VM vmid into a template (POST
// .../template: VM.Allocate; its disks become base images).
func (c *Client) ConvertToTemplate(ctx context.Context, vmid int) error {
	return c.call(ctx, "POST", fmt.Sprintf("convert %d to a template", vmid), c.qemu(vmid)+"/template", map[string]any{})
}
