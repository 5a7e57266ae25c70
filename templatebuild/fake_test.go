package templatebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// fakePVE is a node for the builder: VMs as configs, storages' import
// volumes and their files' checksums, calls recorded.
type fakePVE struct {
	mu    sync.Mutex
	vms   map[int]map[string]string
	vols  map[string]string // volid -> checksum of its file
	sums  map[string]string // url -> checksum of what it serves
	calls []string
	// failDownload is the exit status of a failed download task.
	failDownload string
	// content is the content of every storage.
	content string
	// raced are ids another client takes just before this build's
	// create; failCreate fails a create in its task after writing the
	// config.
	raced      map[int]bool
	failCreate string
	// onCreate runs inside a create that succeeds (the import).
	onCreate func(f *fakePVE)
	// vnets are the SDN vnets (id -> zone), subnets their CIDRs.
	vnets   map[string]string
	subnets map[string][]string
	// created are the configs the creates asked for.
	created []map[string]string
	// metadata is what ImportMetadata answers, by volid.
	metadata map[string]pveapi.ImportMetadata
	// failStop fails StopTask; stopped are the tasks it stopped.
	failStop error
	stopped  []string
}

func newFakePVE() *fakePVE {
	return &fakePVE{vms: map[int]map[string]string{}, vols: map[string]string{}, sums: map[string]string{}, content: "iso,vztmpl,import,snippets",
		vnets: map[string]string{}, subnets: map[string][]string{}}
}

func (f *fakePVE) note(format string, a ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, a...))
}

func (f *fakePVE) ListVMs(context.Context) ([]sandbox.VMInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.VMInfo
	for id, c := range f.vms {
		var tags []string
		if c["tags"] != "" {
			tags = strings.Split(c["tags"], ";")
		}
		out = append(out, sandbox.VMInfo{VMID: id, Name: c["name"], Tags: tags, Template: c["template"] == "1", Status: c["status"], Pool: c["pool"]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VMID < out[j].VMID })
	return out, nil
}

func (f *fakePVE) NextID(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := 100
	for f.vms[id] != nil {
		id++
	}
	return id, nil
}

func (f *fakePVE) StorageVolumes(_ context.Context, storage, content string) ([]pveapi.StorageVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []pveapi.StorageVolume
	for v := range f.vols {
		if strings.HasPrefix(v, storage+":"+content+"/") {
			out = append(out, pveapi.StorageVolume{VolID: v, Content: content})
		}
	}
	return out, nil
}

func (f *fakePVE) VolumePath(_ context.Context, volid string) (string, error) {
	return "/var/lib/vz/" + strings.SplitN(volid, ":", 2)[1], nil
}

func (f *fakePVE) Storage(_ context.Context, storage string) (pveapi.StorageConfig, error) {
	return pveapi.StorageConfig{ID: storage, Type: "dir", Path: "/var/lib/vz", Content: strings.Split(f.content, ",")}, nil
}

func (f *fakePVE) DownloadURL(_ context.Context, storage string, d pveapi.Download) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("download %s %s:%s", d.URL, d.ChecksumAlgorithm, d.Checksum)
	if f.failDownload != "" {
		return "", errors.New("download: " + f.failDownload)
	}
	v := storage + ":import/" + pveapi.NormalizeContentFilename(d.Filename)
	// PVE::Tools download_file_from_url never replaces a file.
	if have, ok := f.vols[v]; ok {
		switch {
		case d.Checksum == "":
			return "", fmt.Errorf("download: refusing to override existing file '/var/lib/vz/import/%s'", d.Filename)
		case have != d.Checksum:
			return "", fmt.Errorf("download: checksum mismatch: got '%s' != expect '%s', aborting", have, d.Checksum)
		}
		return v, nil
	}
	got := f.sums[d.URL]
	if d.Checksum != "" && d.Checksum != got {
		return "", fmt.Errorf("download: checksum mismatch: got '%s' != expect '%s'", got, d.Checksum)
	}
	f.vols[v] = got
	return v, nil
}

func (f *fakePVE) StopTask(_ context.Context, upid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("stop %s", upid)
	if f.failStop != nil {
		return f.failStop
	}
	f.stopped = append(f.stopped, upid)
	return nil
}

func (f *fakePVE) ImportMetadata(_ context.Context, volid string) (pveapi.ImportMetadata, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("import-metadata %s", volid)
	md, ok := f.metadata[volid]
	if !ok {
		return pveapi.ImportMetadata{}, fmt.Errorf("import metadata of %s: invalid format", volid)
	}
	return md, nil
}

func (f *fakePVE) CreateVM(_ context.Context, vmid int, conf map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("create %d", vmid)
	f.created = append(f.created, maps.Clone(conf))
	if f.raced[vmid] {
		delete(f.raced, vmid)
		f.vms[vmid] = map[string]string{"name": "other", "status": "running"}
		return fmt.Errorf("create %d: %w: unable to create VM %d: config file already exists", vmid, sandbox.ErrExists, vmid)
	}
	if f.failCreate != "" {
		f.vms[vmid] = maps.Clone(conf)
		return errors.New(f.failCreate)
	}
	src := strings.SplitN(conf["scsi0"], "import-from=", 2)[1]
	vol := src
	if i := strings.Index(src, ".ova/"); i >= 0 {
		vol = src[:i+4]
	}
	if _, ok := f.vols[vol]; !ok {
		return fmt.Errorf("create: volume %s does not exist", vol)
	}
	if f.onCreate != nil {
		f.onCreate(f)
	}
	c := maps.Clone(conf)
	c["scsi0"] = "local-lvm:vm-" + fmt.Sprint(vmid) + "-disk-0,size=3G"
	c["ide2"] = "local-lvm:vm-" + fmt.Sprint(vmid) + "-cloudinit,media=cdrom"
	c["status"] = "stopped"
	f.vms[vmid] = c
	return nil
}

func (f *fakePVE) ResizeDisk(_ context.Context, vmid, gib int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("resize %d %dG", vmid, gib)
	f.vms[vmid]["scsi0"] = fmt.Sprintf("local-lvm:vm-%d-disk-0,size=%dG", vmid, gib)
	return nil
}

func (f *fakePVE) StartVM(_ context.Context, vmid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("start %d", vmid)
	f.vms[vmid]["status"] = "running"
	return nil
}

func (f *fakePVE) ShutdownVM(_ context.Context, vmid int, _ time.Duration, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("shutdown %d", vmid)
	f.vms[vmid]["status"] = "stopped"
	return nil
}

func (f *fakePVE) DeleteVM(_ context.Context, vmid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("delete %d", vmid)
	if _, ok := f.vms[vmid]; !ok {
		return fmt.Errorf("vm %d: %w", vmid, sandbox.ErrNotFound)
	}
	delete(f.vms, vmid)
	return nil
}

func (f *fakePVE) VMConfig(_ context.Context, vmid int) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.vms[vmid]
	if !ok {
		return nil, sandbox.ErrNotFound
	}
	out := maps.Clone(c)
	delete(out, "status")
	return out, nil
}

func (f *fakePVE) UpdateVMConfig(_ context.Context, vmid int, set map[string]string, del []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := slices.Sorted(maps.Keys(set))
	f.note("config %d set=%v del=%v", vmid, keys, del)
	for _, k := range del {
		delete(f.vms[vmid], k)
	}
	maps.Copy(f.vms[vmid], set)
	return nil
}

func (f *fakePVE) ConvertToTemplate(_ context.Context, vmid int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("template %d", vmid)
	if f.vms[vmid]["status"] != "stopped" {
		return errors.New("you can't convert a VM to template if VM is running")
	}
	f.vms[vmid]["template"] = "1"
	return nil
}

// fakeAgent answers commands by their first word; answers absent from
// replies exit 0. down makes every call fail.
type fakeAgent struct {
	mu      sync.Mutex
	replies map[string]AgentResult
	down    bool
	runs    []string
	// hook runs (unlocked) on a dpkg-query check.
	hook func()
}

func (a *fakeAgent) Exec(_ context.Context, vmid int, argv []string, _ time.Duration) (AgentResult, error) {
	if argv[0] == "dpkg-query" && a.hook != nil {
		a.hook()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs = append(a.runs, strings.Join(argv, " "))
	if a.down {
		return AgentResult{}, errors.New("connect to the agent: no such file")
	}
	return a.replies[argv[0]], nil
}

// fakeHost keeps files in a map.
type fakeHost struct {
	mu     sync.Mutex
	files  map[string]string
	writes []string
	sums   map[string]string // path -> checksum
	lists  map[string]string // url -> body
	pve    *fakePVE          // the node's volumes
	ledger map[int]Record
	images map[string]ImageRecord
}

func newFakeHost() *fakeHost {
	return &fakeHost{files: map[string]string{}, sums: map[string]string{}, lists: map[string]string{}, ledger: map[int]Record{}, images: map[string]ImageRecord{}}
}

func (h *fakeHost) WriteFile(path string, data []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.files[path] = string(data)
	h.writes = append(h.writes, path)
	return nil
}

func (h *fakeHost) Remove(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.files, path)
	return nil
}

// Checksum is sums[path], else the checksum the node's volume of the
// path has (pve's vols).
func (h *fakeHost) Checksum(path, _ string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.sums[path]; ok {
		return s, nil
	}
	if h.pve != nil {
		h.pve.mu.Lock()
		defer h.pve.mu.Unlock()
		if name, ok := strings.CutPrefix(path, "/var/lib/vz/"); ok {
			for v, sum := range h.pve.vols {
				if strings.HasSuffix(v, ":"+name) {
					return sum, nil
				}
			}
		}
	}
	return "", errors.New("no such file")
}

func (h *fakeHost) Fetch(_ context.Context, url string, _ int64) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.lists[url]
	if !ok {
		return nil, errors.New("404 Not Found")
	}
	return []byte(b), nil
}

// Open serves lists[url] as Fetch does.
func (h *fakeHost) Open(ctx context.Context, url string) (io.ReadCloser, int64, error) {
	b, err := h.Fetch(ctx, url, 0)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

func (h *fakeHost) RecordImage(r ImageRecord) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.images[r.Volume] = r
	return nil
}

func (h *fakeHost) RecordedImage(volid string) (ImageRecord, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.images[volid]
	return r, ok, nil
}

func (f *fakePVE) ListVNets(context.Context) ([]sandbox.VNetInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.VNetInfo
	for id, z := range f.vnets {
		out = append(out, sandbox.VNetInfo{ID: id, Zone: z})
	}
	return out, nil
}

func (f *fakePVE) VNetSubnets(_ context.Context, vnet string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.subnets[vnet]), nil
}

func (f *fakePVE) ListSubnetCIDRs(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, s := range f.subnets {
		out = append(out, s...)
	}
	return out, nil
}

func (f *fakePVE) CreateZone(_ context.Context, z sandbox.ZoneSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("zone %s", z.ID)
	return nil
}

func (f *fakePVE) CreateVNet(_ context.Context, v sandbox.VNetSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("vnet %s %s", v.ID, v.Zone)
	f.vnets[v.ID] = v.Zone
	return nil
}

func (f *fakePVE) CreateSubnet(_ context.Context, s sandbox.SubnetSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ranges []string
	for _, r := range s.DHCPRanges {
		ranges = append(ranges, r.Start+"-"+r.End)
	}
	f.note("subnet %s %s snat=%v dhcp=%s", s.VNet, s.CIDR, s.SNAT, strings.Join(ranges, ","))
	f.subnets[s.VNet] = append(f.subnets[s.VNet], s.CIDR)
	return nil
}

func (f *fakePVE) ApplySDN(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("apply sdn")
	return nil
}

func (h *fakeHost) Record(vmid int, r Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ledger[vmid] = r
	return nil
}

func (h *fakeHost) Recorded(vmid int) (Record, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.ledger[vmid]
	return r, ok, nil
}

func (h *fakeHost) Forget(vmid int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.ledger, vmid)
	return nil
}
