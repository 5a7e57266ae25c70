// Package pveapi implements sandbox.Proxmox and mgmtport.Firewall over the
// Proxmox VE API with github.com/luthermonson/go-proxmox, authenticated with
// an API token (never root credentials). Every call that starts a task waits
// for it and returns the task's failure as an error. Missing objects come
// back wrapping sandbox.ErrNotFound, taken ids wrapping
// sandbox.ErrExists.
package pveapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/pve-inspect/pve-inspect/firewall/mgmtport"
	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// Options configure a Client.
type Options struct {
	// URL is the API base, e.g. https://127.0.0.1:8006/api2/json.
	URL string
	// TokenID is "user@realm!name"; Secret its secret.
	TokenID, Secret string
	// Node is this node's Proxmox name.
	Node string
	// RootCAFile verifies the API certificate (e.g. /etc/pve/pve-root-ca.pem);
	// empty uses the system pool.
	RootCAFile string
	// HTTPClient replaces the HTTP client (tests).
	HTTPClient *http.Client
	// TaskPoll is the first task status poll delay (100ms, then x1.5 up to
	// 1s); TaskTimeout the longest wait for one task (10m).
	TaskPoll, TaskTimeout time.Duration
	// TaskStatusGrace is how long a task's status reads may fail in a row
	// (a pveproxy restart, a 503) before a wait gives up on the task (30s).
	TaskStatusGrace time.Duration
	// Logger receives what is worth saying but not failing for: another
	// node's SDN reload warnings, other clients' pending SDN edits an
	// apply commits (discarded when nil).
	Logger *slog.Logger
}

// Client talks to one Proxmox node.
type Client struct {
	c *proxmox.Client
	// hc is the HTTP client go-proxmox sends with (its TLS options
	// applied), for the few answers whose result attributes beside
	// "data" matter (getEnvelope).
	hc   *http.Client
	node string
	o    Options
	log  *slog.Logger
	// own is what this client edited in the SDN configuration since its
	// last apply; an apply reports the other pending edits as foreign.
	own *sdnEdits
}

var (
	_ sandbox.Proxmox   = (*Client)(nil)
	_ mgmtport.Firewall = (*Client)(nil)
)

// New returns a Client. It refuses anything but an API token.
func New(o Options) (*Client, error) {
	if o.URL == "" || o.Node == "" {
		return nil, errors.New("pve: URL and Node are required")
	}
	if !strings.Contains(o.TokenID, "!") || o.Secret == "" {
		return nil, fmt.Errorf("pve: token id %q: want user@realm!tokenname with a secret", o.TokenID)
	}
	return newClient(o, proxmox.WithAPIToken(o.TokenID, o.Secret))
}

// newClient builds the client with one way to authenticate.
func newClient(o Options, auth proxmox.Option) (*Client, error) {
	if o.TaskPoll == 0 {
		o.TaskPoll = 100 * time.Millisecond
	}
	if o.TaskTimeout == 0 {
		o.TaskTimeout = 10 * time.Minute
	}
	if o.TaskStatusGrace == 0 {
		o.TaskStatusGrace = 30 * time.Second
	}
	opts := []proxmox.Option{auth, proxmox.WithUserAgent("pve-inspectd")}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}}
	}
	opts = append(opts, proxmox.WithHTTPClient(hc))
	if o.RootCAFile != "" {
		opts = append(opts, proxmox.WithRootCAFile(o.RootCAFile))
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{c: proxmox.NewClient(strings.TrimRight(o.URL, "/"), opts...), hc: hc, node: o.Node, o: o, log: log, own: newSDNEdits()}, nil
}

var (
	// "already used": a snapshot name taken (pve-guest-common
	// AbstractConfig.pm snapshot_prepare: "snapshot name '$snapname'
	// already used"), a state the caller is told as a conflict
	// "File exists": a clone to an id another node's VM has passes
	// clone_vm's check of the local node's config file and fails when
	// pmxcfs refuses the rename of its temporary config (pve-common
	// File.pm file_set_contents: "close (rename) atomic file '...'
	// failed: File exists")
	reExists  = regexp.MustCompile(`(?i)already exists|already in use|already used|failed: File exists`)
	reMissing = regexp.MustCompile(`(?i)does not exist`)
)

// classify wraps Proxmox errors with the sandboxapi sentinels. A task that
// failed because its object is missing counts as not found too: a stop of
// a missing VM fails inside its task on a real node (qemu-server vm_stop
// forks before loading the config).
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var tf *proxmox.TaskFailedError
	var ue *url.Error
	switch {
	case errors.As(err, &ue) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		// No HTTP answer at all: the node (its pveproxy) is down or
		// unreachable; in a cluster only this node's work stops.
		host := ue.URL
		if u, perr := url.Parse(ue.URL); perr == nil {
			host = u.Host
		}
		return fmt.Errorf("%s: the Proxmox API at %s does not answer (is the node down?): %w", op, host, err)
	case proxmox.IsNotFound(err), errors.As(err, &tf) && reMissing.MatchString(tf.ExitStatus):
		return fmt.Errorf("%s: %w: %w", op, sandbox.ErrNotFound, err)
	case reExists.MatchString(err.Error()):
		return fmt.Errorf("%s: %w: %w", op, sandbox.ErrExists, err)
	case strings.Contains(err.Error(), "invalid lock token provided"):
		// pve-network SDN.pm lock_sdn_config: another client holds the
		// SDN global lock (/etc/pve/sdn/.lock), and every edit without
		// its token fails until it is released.
		return fmt.Errorf("%s: another client holds the SDN global lock (/etc/pve/sdn/.lock; pve-inspectd doctor names it): no zone can be created or removed until it releases it: %w", op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// warnPolicy decides which of a task's warnings (its log's "WARN: " lines,
// prefix cut) fail the call; nil lets a task with warnings succeed.
type warnPolicy func(warns []string) (fatal []string)

// allWarnings makes every warning fatal.
func allWarnings(warns []string) []string { return warns }

// wait polls the task until it ends: first after TaskPoll, then backing
// off (x1.5, at most 1s) so that long tasks cost few status requests. A
// failed task is a *proxmox.TaskFailedError; a task that ended with
// warnings ("WARNINGS: n", which go-proxmox counts as a success) is one too
// when policy finds a fatal one among them (or cannot read them).
//
// A status read that fails does not end the wait: the task runs on
// whether or not pveproxy answers (a restart, a 503), and a caller told
// the wait failed would stop a healthy task (templatebuild stops a
// download it no longer waits for). The wait goes on polling, with the
// same backoff, and gives up with a *TaskUnfinishedError only once the
// reads have failed for TaskStatusGrace in a row (from the start of the
// first failed read: a read may take long to fail), or when ctx ends; a
// read refused for good (403: the token may not read it; 400) gives up
// at once. A
// task PVE no longer knows ("no such task": its log file is gone,
// pve-manager API2/Tasks.pm read_task_status) is looked up in the node's
// task history through go-proxmox's Wait.
func (c *Client) wait(ctx context.Context, op string, upid string, policy warnPolicy) error {
	if upid == "" {
		return nil
	}
	t := proxmox.NewTask(proxmox.UPID(upid), c.c)
	ctx, cancel := context.WithTimeout(ctx, c.o.TaskTimeout)
	defer cancel()
	d := c.o.TaskPoll
	var failing time.Time // when the first of the failed reads in a row began
	for {
		select {
		case <-ctx.Done():
			return &TaskUnfinishedError{UPID: upid, Err: classify(op, ctx.Err())}
		case <-time.After(d):
		}
		d = min(d*3/2, time.Second)
		if began, err := c.readStatus(ctx, t); err != nil {
			if ctx.Err() != nil {
				return &TaskUnfinishedError{UPID: upid, Err: classify(op, ctx.Err())}
			}
			if proxmox.IsForbidden(err) || proxmox.IsBadRequest(err) {
				// the token may not read it, or the node refuses the
				// request: no retry changes that
				return &TaskUnfinishedError{UPID: upid, Err: classify(op, fmt.Errorf("the status of task %s cannot be read (it may still run): %w", upid, err))}
			}
			if failing.IsZero() {
				// from the read's start: a read may take long to fail
				failing = began
			}
			if since := time.Since(failing); since >= c.o.TaskStatusGrace {
				return &TaskUnfinishedError{UPID: upid, Err: classify(op, fmt.Errorf("the status of task %s could not be read for %s (it may still run): %w", upid, since.Round(time.Millisecond), err))}
			}
			continue
		}
		failing = time.Time{}
		if t.IsCompleted {
			if t.IsSuccessful && (policy == nil || t.ExitStatus == proxmox.TaskExitOK) {
				return nil
			}
			return classify(op, c.taskFailure(ctx, t, policy))
		}
	}
}

// readStatus reads t's status once. A task PVE answers "no such task"
// for is looked up in the node's task history (go-proxmox's Wait does; it
// waits on only if a later read finds the task running); a task that
// ended is no error, whatever its exit status. began is when the request
// that failed was sent, for the grace (after go-proxmox's Wait, which may
// have read the status successfully meanwhile, the time it returned).
func (c *Client) readStatus(ctx context.Context, t *proxmox.Task) (began time.Time, err error) {
	began = time.Now()
	err = t.Ping(ctx)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "no such task") {
		return began, err
	}
	if err := t.Wait(ctx, c.o.TaskPoll, c.o.TaskTimeout); err != nil && !t.IsCompleted {
		return time.Now(), err
	}
	return began, nil
}

// taskFailure describes a task that did not end OK; for warnings it adds
// the task log's warning lines policy finds fatal, which say what failed,
// and is nil when policy finds none (a log that cannot be read, or has no
// warning line, fails).
func (c *Client) taskFailure(ctx context.Context, t *proxmox.Task, policy warnPolicy) error {
	err := &proxmox.TaskFailedError{UPID: t.UPID, Node: t.Node, Type: t.Type, ID: t.ID, User: t.User, ExitStatus: t.ExitStatus}
	if !strings.HasPrefix(t.ExitStatus, "WARNINGS") {
		return err
	}
	log, lerr := t.Log(ctx, 0, 500)
	if lerr != nil {
		return err
	}
	var warns []string
	for i := 0; i < len(log); i++ {
		if l := log[i]; strings.HasPrefix(l, "WARN: ") {
			warns = append(warns, strings.TrimPrefix(l, "WARN: "))
		}
	}
	if len(warns) == 0 {
		return err
	}
	if policy == nil {
		policy = allWarnings
	}
	fatal := policy(warns)
	if len(fatal) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", err, strings.Join(fatal, "; "))
}

// call sends a request and waits for the task it may return.
func (c *Client) call(ctx context.Context, method, op, path string, body any) error {
	return c.callTask(ctx, method, op, path, body, nil)
}

// callTask is call, with policy choosing which of a task's warnings fail
// it (nil: none).
func (c *Client) callTask(ctx context.Context, method, op, path string, body any, policy warnPolicy) error {
	var upid any
	var err error
	switch method {
	case "POST":
		err = c.c.Post(ctx, path, body, &upid)
	case "PUT":
		err = c.c.Put(ctx, path, body, &upid)
	case "DELETE":
		err = c.c.Delete(ctx, path, &upid)
	}
	if err != nil {
		return classify(op, err)
	}
	if s, ok := upid.(string); ok && strings.HasPrefix(s, "UPID:") {
		return c.wait(ctx, op, s, policy)
	}
	return nil
}

func (c *Client) qemu(vmid int) string {
	return fmt.Sprintf("/nodes/%s/qemu/%d", url.PathEscape(c.node), vmid)
}

// flexInt decodes numbers that Proxmox sends as numbers or strings.
type flexInt int

func (f *flexInt) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "" || s == "null" {
		*f = 0
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return err
	}
	*f = flexInt(v)
	return nil
}

// NextID implements sandbox.Proxmox.
func (c *Client) NextID(ctx context.Context) (int, error) {
	var id flexInt
	if err := c.c.Get(ctx, "/cluster/nextid", &id); err != nil {
		return 0, classify("next id", err)
	}
	return int(id), nil
}

// VMIDFree reports whether no VM of the cluster has id: GET
// /cluster/nextid?vmid=N answers N when it is free and fails the vmid
// parameter with "VM N already exists" when it is not (pve-manager
// API2/Cluster.pm nextid, from the cluster's vmlist).
func (c *Client) VMIDFree(ctx context.Context, id int) (bool, error) {
	var got flexInt
	err := c.c.Get(ctx, "/cluster/nextid?vmid="+strconv.Itoa(id), &got)
	switch {
	case err == nil:
		return int(got) == id, nil
	case strings.Contains(err.Error(), fmt.Sprintf("VM %d already exists", id)):
		return false, nil
	}
	return false, classify("is vm id free", err)
}

// resource is a VM as GET /cluster/resources lists it. Only the VM list,
// lock, tags and pool are live there: name, status and template come from
// what pvestatd last published (pve-manager PVE/API2Tools.pm
// extract_vm_stats: "unknown" and no name until its first update, then up
// to 10 s old), so only Pool is read from it.
type resource struct {
	Type string  `json:"type"`
	VMID flexInt `json:"vmid"`
	Node string  `json:"node"`
	Pool string  `json:"pool"`
}

// vmStatus is a VM as the node itself reports it (GET /nodes/{node}/qemu and
// .../status/current, qemu-server vmstatus): read live from its config and
// the running process.
type vmStatus struct {
	VMID     flexInt `json:"vmid"`
	Name     string  `json:"name"`
	Status   string  `json:"status"`
	Tags     string  `json:"tags"`
	Template flexInt `json:"template"`
	Lock     string  `json:"lock"`
}

func (v vmStatus) info(pool string) sandbox.VMInfo {
	tags := strings.FieldsFunc(v.Tags, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
	return sandbox.VMInfo{VMID: int(v.VMID), Name: v.Name, Status: v.Status, Tags: tags, Pool: pool, Template: v.Template != 0, Lock: v.Lock}
}

// The guest kinds: their type in /cluster/resources and their directory
// of the node's API (/nodes/{node}/qemu, /nodes/{node}/lxc).
const (
	kindQemu = "qemu"
	kindLXC  = "lxc"
)

// kindLabel is what errors call a guest of kind.
func kindLabel(kind string) string {
	if kind == kindLXC {
		return "CT"
	}
	return "vm"
}

// pools maps the guests of kind (kindQemu, kindLXC) of this node to their
// pools (live in /cluster/resources: read from user.cfg on every call).
func (c *Client) pools(ctx context.Context, kind string) (map[int]string, error) {
	var rs []resource
	if err := c.c.Get(ctx, "/cluster/resources?type=vm", &rs); err != nil {
		return nil, classify("list resources", err)
	}
	out := map[int]string{}
	for _, r := range rs {
		if r.Type == kind && r.Node == c.node {
			out[int(r.VMID)] = r.Pool
		}
	}
	return out, nil
}

// nodeGuests lists the node's guests of kind with their live status.
func (c *Client) nodeGuests(ctx context.Context, kind string) ([]vmStatus, error) {
	var vs []vmStatus
	if err := c.c.Get(ctx, "/nodes/"+url.PathEscape(c.node)+"/"+kind, &vs); err != nil {
		return nil, classify("list "+kindLabel(kind)+"s", err)
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].VMID < vs[j].VMID })
	return vs, nil
}

// TemplateID implements sandbox.Proxmox.
func (c *Client) TemplateID(ctx context.Context, name string) (int, error) {
	return c.templateID(ctx, kindQemu, name)
}

// templateID finds a template of kind by name.
func (c *Client) templateID(ctx context.Context, kind, name string) (int, error) {
	vs, err := c.nodeGuests(ctx, kind)
	if err != nil {
		return 0, err
	}
	for _, v := range vs {
		if v.Template != 0 && v.Name == name {
			return int(v.VMID), nil
		}
	}
	what := "template"
	if kind == kindLXC {
		what = "CT template"
	}
	return 0, fmt.Errorf("%s %q: %w", what, name, sandbox.ErrNotFound)
}

// CloneVM implements sandbox.Proxmox: a linked clone (no "full").
func (c *Client) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	body := map[string]any{"newid": s.NewID, "name": s.Name}
	if s.Pool != "" {
		body["pool"] = s.Pool
	}
	return c.call(ctx, "POST", fmt.Sprintf("clone %d to %d", s.Template, s.NewID), c.qemu(s.Template)+"/clone", body)
}

var reNet = regexp.MustCompile(`^net(\d+)$`)

func (c *Client) config(ctx context.Context, vmid int) (map[string]any, error) {
	var cfg map[string]any
	if err := c.c.Get(ctx, c.qemu(vmid)+"/config", &cfg); err != nil {
		return nil, classify(fmt.Sprintf("read config of %d", vmid), err)
	}
	return cfg, nil
}

// ConfigureVM implements sandbox.Proxmox. NICs of the template that are
// not ours are removed, so no clone stays on a host bridge; every NIC is
// written with the model asked for (qemu-server's netN "<model>=<MAC>"
// short form: Network.pm $net_fmt, model a default key of
// $nic_model_list), virtio unless e1000.
func (c *Client) ConfigureVM(ctx context.Context, vmid int, v sandbox.VMConfig) error {
	cfg, err := c.config(ctx, vmid)
	if err != nil {
		return err
	}
	body := map[string]any{"tags": strings.Join(v.Tags, ";"), "cores": v.Cores, "memory": strconv.Itoa(v.MemoryMiB)}
	for i, b := range v.Bridges {
		model := v.NICModel
		if model == "" {
			model = hardening.NICVirtio
		}
		if i < len(v.MACs) && v.MACs[i] != "" {
			model += "=" + v.MACs[i]
		}
		body[fmt.Sprintf("net%d", i)] = model + ",bridge=" + b + ",firewall=0"
	}
	if v.NoAgent {
		// no virtio-serial port, no qga socket (qemu-server
		// config_to_command adds both only with the agent enabled);
		// VM.Config.Options, as the hardening's agent enabled=1
		body["agent"] = "0"
	}
	if del := extraNets(cfg, len(v.Bridges)); len(del) > 0 {
		body["delete"] = strings.Join(del, ",")
	}
	if err := hardware(body, cfg, v); err != nil {
		return fmt.Errorf("configure %d: %w", vmid, err)
	}
	return c.call(ctx, "POST", fmt.Sprintf("configure %d", vmid), c.qemu(vmid)+"/config", body)
}

// hardware adds v's OS type, CPU model and firmware to the configure
// request body for a clone of configuration cfg. The EFI vars disk is a
// new volume "STORAGE:1,efitype=4m,pre-enrolled-keys=0" on the boot
// disk's storage: qemu-server's create_disks allocates it with the size
// of the OVMF vars image whatever the number (OVMF.pm create_efidisk),
// checking Datastore.AllocateSpace on the storage (API2/Qemu.pm
// $check_storage_access) and VM.Config.Disk; bios and ostype need
// VM.Config.Options, cpu VM.Config.CPU. A Windows ostype goes with the
// machine pinned (hardening.WindowsMachine, VM.Config.HWType): qemu-server
// would pin it otherwise, to the newest installed QEMU's version. A clone with an efidisk0 of
// efitype 4m keeps it (a template installed with UEFI); one of another
// type is refused: replacing it would drop the guest's boot entries.
func hardware(body map[string]any, cfg map[string]any, v sandbox.VMConfig) error {
	if v.OSType != "" {
		body["ostype"] = v.OSType
		if hardening.IsWindows(v.OSType) {
			// with machine in the same request qemu-server does not pin
			// it itself (update_vm_api, the ostype branch)
			cur, _ := cfg["machine"].(string)
			body["machine"] = hardening.WindowsMachine(cur)
		}
	}
	if v.CPU != "" {
		cur, _ := cfg["cpu"].(string)
		body["cpu"] = hardening.CPUValue(cur, v.CPU)
	}
	if !v.UEFI {
		return nil
	}
	body["bios"] = "ovmf"
	if efi, ok := cfg["efidisk0"].(string); ok {
		if !hardening.EFIDisk4M(efi) {
			return fmt.Errorf("the template's efidisk0 (%s) is not of efitype 4m: rebuild the template with a 4m EFI disk", efi)
		}
		return nil
	}
	disk, err := bootDisk(cfg)
	if err != nil {
		return err
	}
	val, _ := cfg[disk].(string)
	storage, _, ok := strings.Cut(val, ":")
	if !ok || storage == "" {
		return fmt.Errorf("the boot disk %s (%s) names no storage for the EFI disk", disk, val)
	}
	body["efidisk0"] = hardening.NewEFIDisk(storage)
	return nil
}

// extraNets returns the NIC keys netN of a guest's config with N >= keep
// (the template's NICs a configure deletes), sorted.
func extraNets(cfg map[string]any, keep int) []string {
	var out []string
	for k := range cfg {
		if m := reNet.FindStringSubmatch(k); m != nil {
			if n, _ := strconv.Atoi(m[1]); n >= keep {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// bootDisk finds the VM's boot disk from its config.
func bootDisk(cfg map[string]any) (string, error) {
	conf := map[string]string{}
	for k, v := range cfg {
		if s, ok := v.(string); ok {
			conf[k] = s
		}
	}
	if d := sandbox.BootDisk(conf); d != "" {
		return d, nil
	}
	return "", errors.New("no boot disk in the VM config")
}

// ResizeDisk implements sandbox.Proxmox.
func (c *Client) ResizeDisk(ctx context.Context, vmid int, sizeGiB int) error {
	cfg, err := c.config(ctx, vmid)
	if err != nil {
		return err
	}
	disk, err := bootDisk(cfg)
	if err != nil {
		return fmt.Errorf("resize %d: %w", vmid, err)
	}
	return c.call(ctx, "PUT", fmt.Sprintf("resize %s of %d", disk, vmid), c.qemu(vmid)+"/resize", map[string]any{"disk": disk, "size": fmt.Sprintf("%dG", sizeGiB)})
}

// StartVM implements sandbox.Proxmox. A start on an SDN vnet goes
// through qemu-server's pve-bridge hook, which talks to the zone's
// dnsmasq (pve-network Dnsmasq.pm add_ip_mapping: a reload for a new
// mapping, then update_lease over D-Bus) with no error handling; while any
// client's SDN apply has the node's dnsmasqs stopped (before_regenerate,
// until each zone's is started again) the hook dies and QEMU does not
// start. Such a start is made again, with a growing pause, until
// startRetryFor has passed.
func (c *Client) StartVM(ctx context.Context, vmid int) error {
	return c.startGuest(ctx, fmt.Sprintf("start %d", vmid), c.qemu(vmid), vmid)
}

// startGuest starts the guest at path (a VM's or a CT's) and starts it
// again while its start fails in the hook that maps its NICs in their
// zone's dnsmasq (StartVM, StartCT).
func (c *Client) startGuest(ctx context.Context, op, path string, vmid int) error {
	deadline := time.Now().Add(startRetryFor)
	for try := 1; ; try++ {
		err := c.call(ctx, "POST", op, path+"/status/start", map[string]any{})
		var tf *proxmox.TaskFailedError
		if err == nil || time.Now().After(deadline) || !errors.As(err, &tf) || !c.taskLogHas(ctx, tf.UPID, reBridgeHook) {
			return err
		}
		c.log.Warn("guest start failed in its network hook (an SDN apply had the zone's dnsmasq stopped); starting again", "vmid", vmid, "try", try)
		select {
		case <-ctx.Done():
			return classify(op, ctx.Err())
		case <-time.After(min(time.Duration(try)*250*time.Millisecond, 2*time.Second)):
		}
	}
}

// startRetryFor bounds how long StartVM starts again.
const startRetryFor = 60 * time.Second

// reBridgeHook is a start task's log line of the hook that plugs a NIC in
// failing: QEMU's "network script ... pve-bridge failed", or that hook's
// (or a CT's lxc-pve-prestart-hook's, add_dhcp_mapping) dnsmasq reload
// (PVE::Tools::run_command's "command '...' failed").
var reBridgeHook = regexp.MustCompile(`network script \S*pve-bridge failed|command 'systemctl reload dnsmasq@[^']*' failed`)

// taskLogHas reports whether a line of task upid's log matches re (false
// when the log cannot be read).
func (c *Client) taskLogHas(ctx context.Context, upid proxmox.UPID, re *regexp.Regexp) bool {
	log, err := proxmox.NewTask(upid, c.c).Log(ctx, 0, 500)
	if err != nil {
		return false
	}
	for _, l := range log {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// StopVM implements sandbox.Proxmox (hard stop).
func (c *Client) StopVM(ctx context.Context, vmid int) error {
	return c.call(ctx, "POST", fmt.Sprintf("stop %d", vmid), c.qemu(vmid)+"/status/stop", map[string]any{})
}

// DeleteVM implements sandbox.Proxmox. It stops the VM first, whatever
// its reported state (a stop of a stopped VM is a successful task on a real
// node, and a status read can be stale), since the destroy refuses a
// running VM.
func (c *Client) DeleteVM(ctx context.Context, vmid int) error {
	if err := c.StopVM(ctx, vmid); err != nil {
		return err
	}
	return c.call(ctx, "DELETE", fmt.Sprintf("delete %d", vmid), c.qemu(vmid)+"?purge=1&destroy-unreferenced-disks=1", nil)
}

// VM implements sandbox.Proxmox: status, name, tags and template from
// GET .../status/current (live), the pool from /cluster/resources.
func (c *Client) VM(ctx context.Context, vmid int) (sandbox.VMInfo, error) {
	return c.guest(ctx, kindQemu, vmid, c.qemu(vmid))
}

// guest reads the guest of kind at path: its pool from
// /cluster/resources (ErrNotFound when it is not listed there as a guest
// of kind on this node), then its live status/current.
func (c *Client) guest(ctx context.Context, kind string, vmid int, path string) (sandbox.VMInfo, error) {
	pools, err := c.pools(ctx, kind)
	if err != nil {
		return sandbox.VMInfo{}, err
	}
	pool, ok := pools[vmid]
	if !ok {
		return sandbox.VMInfo{}, fmt.Errorf("%s %d: %w", kindLabel(kind), vmid, sandbox.ErrNotFound)
	}
	var v vmStatus
	if err := c.c.Get(ctx, path+"/status/current", &v); err != nil {
		return sandbox.VMInfo{}, classify(fmt.Sprintf("read status of %s %d", kindLabel(kind), vmid), err)
	}
	v.VMID = flexInt(vmid)
	return v.info(pool), nil
}

// ListVMs implements sandbox.Proxmox: GET /nodes/{node}/qemu (live),
// pools from /cluster/resources.
func (c *Client) ListVMs(ctx context.Context) ([]sandbox.VMInfo, error) {
	return c.listGuests(ctx, kindQemu)
}

// listGuests lists the node's guests of kind (live) with their pools.
func (c *Client) listGuests(ctx context.Context, kind string) ([]sandbox.VMInfo, error) {
	vs, err := c.nodeGuests(ctx, kind)
	if err != nil {
		return nil, err
	}
	pools, err := c.pools(ctx, kind)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.VMInfo, len(vs))
	for i, v := range vs {
		out[i] = v.info(pools[int(v.VMID)])
	}
	return out, nil
}

// Snapshot implements sandbox.Proxmox (disk-only snapshot).
func (c *Client) Snapshot(ctx context.Context, vmid int, name string) error {
	return c.call(ctx, "POST", fmt.Sprintf("snapshot %d", vmid), c.qemu(vmid)+"/snapshot", map[string]any{"snapname": name})
}

// Rollback implements sandbox.Proxmox. A rollback to a snapshot without
// RAM stops the VM; start=1 has the same task start it again.
func (c *Client) Rollback(ctx context.Context, vmid int, name string) error {
	return c.call(ctx, "POST", fmt.Sprintf("rollback %d to %s", vmid, name), c.qemu(vmid)+"/snapshot/"+url.PathEscape(name)+"/rollback", map[string]any{"start": 1})
}

// CreateZone implements sandbox.Proxmox: a simple zone with the dnsmasq
// DHCP and the PVE IPAM.
func (c *Client) CreateZone(ctx context.Context, z sandbox.ZoneSpec) error {
	c.own.add("zone", z.ID)
	return c.call(ctx, "POST", "create zone "+z.ID, "/cluster/sdn/zones",
		map[string]any{"zone": z.ID, "type": "simple", "dhcp": "dnsmasq", "ipam": "pve", "nodes": c.node})
}

// DeleteZone implements sandbox.Proxmox.
func (c *Client) DeleteZone(ctx context.Context, id string) error {
	c.own.add("zone", id)
	return c.call(ctx, "DELETE", "delete zone "+id, "/cluster/sdn/zones/"+url.PathEscape(id), nil)
}

// CreateVNet implements sandbox.Proxmox.
func (c *Client) CreateVNet(ctx context.Context, v sandbox.VNetSpec) error {
	c.own.add("vnet", v.ID)
	return c.call(ctx, "POST", "create vnet "+v.ID, "/cluster/sdn/vnets",
		map[string]any{"vnet": v.ID, "zone": v.Zone, "alias": v.Alias, "type": "vnet"})
}

// DeleteVNet implements sandbox.Proxmox.
func (c *Client) DeleteVNet(ctx context.Context, id string) error {
	c.own.add("vnet", id)
	return c.call(ctx, "DELETE", "delete vnet "+id, "/cluster/sdn/vnets/"+url.PathEscape(id), nil)
}

// CreateSubnet implements sandbox.Proxmox.
func (c *Client) CreateSubnet(ctx context.Context, s sandbox.SubnetSpec) error {
	body := map[string]any{"subnet": s.CIDR, "type": "subnet", "gateway": s.Gateway, "snat": boolInt(s.SNAT)}
	// dhcp-range is an array of pve-sdn-dhcp-range strings, one per range
	// (pve-network SubnetPlugin.pm properties), sent in the ranges' order:
	// Proxmox allocates from them in that order (Subnets.pm
	// add_next_free_ip).
	var ranges []string
	for _, r := range s.DHCPRanges {
		ranges = append(ranges, "start-address="+r.Start+",end-address="+r.End)
	}
	if len(ranges) > 0 {
		body["dhcp-range"] = ranges
	}
	c.own.add("subnet", s.VNet+" "+s.CIDR)
	return c.call(ctx, "POST", "create subnet "+s.CIDR, "/cluster/sdn/vnets/"+url.PathEscape(s.VNet)+"/subnets", body)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

type subnet struct {
	ID   string `json:"subnet"`
	CIDR string `json:"cidr"`
	Zone string `json:"zone"`
}

func (c *Client) subnets(ctx context.Context, vnet string) ([]subnet, error) {
	var ss []subnet
	if err := c.c.Get(ctx, "/cluster/sdn/vnets/"+url.PathEscape(vnet)+"/subnets?pending=1", &ss); err != nil {
		return nil, classify("list subnets of "+vnet, err)
	}
	for i := range ss {
		if ss[i].CIDR == "" {
			ss[i].CIDR = subnetCIDR(ss[i].ID)
		}
	}
	return ss, nil
}

// subnetCIDR turns a subnet id "<zone>-10.0.0.0-24" into "10.0.0.0/24".
func subnetCIDR(id string) string {
	parts := strings.Split(id, "-")
	if len(parts) < 3 {
		return ""
	}
	return parts[len(parts)-2] + "/" + parts[len(parts)-1]
}

// DeleteSubnet implements sandbox.Proxmox. It first removes the IPAM
// entries of the vnet inside the subnet (a VM's NIC leaves one behind when
// its destroy did not finish), since the pve IPAM refuses to delete a
// subnet that still has any (pve-network Ipams/PVEPlugin.pm del_subnet:
// "cannot delete subnet '<cidr>', not empty"), as the reference Inspect
// plugin does before its teardown.
func (c *Client) DeleteSubnet(ctx context.Context, vnet, cidr string) error {
	ss, err := c.subnets(ctx, vnet)
	if err != nil {
		return err
	}
	for _, s := range ss {
		if s.CIDR == cidr {
			if err := c.clearIPAM(ctx, vnet, s.Zone, cidr); err != nil {
				return err
			}
			c.own.add("subnet", vnet+" "+cidr)
			return c.call(ctx, "DELETE", "delete subnet "+cidr, "/cluster/sdn/vnets/"+url.PathEscape(vnet)+"/subnets/"+url.PathEscape(s.ID), nil)
		}
	}
	return fmt.Errorf("subnet %s of %s: %w", cidr, vnet, sandbox.ErrNotFound)
}

// ipamEntry is one entry of GET /cluster/sdn/ipams/pve/status.
type ipamEntry struct {
	VNet    string  `json:"vnet"`
	Zone    string  `json:"zone"`
	Subnet  string  `json:"subnet"`
	IP      string  `json:"ip"`
	MAC     string  `json:"mac"`
	VMID    flexInt `json:"vmid"`
	Gateway flexInt `json:"gateway"`
}

// IPAMAddresses implements sandbox.Proxmox: the IPv4 entries of the pve
// IPAM on the given vnets that name a VM or a MAC (GET
// /cluster/sdn/ipams/pve/status, which lists only the entries of zones
// with the pve IPAM and DHCP whose vnet the token may audit: pve-network
// API2/Network/SDN/Ipams.pm ipamindex; an entry's vmid is the VM whose
// NIC qemu-server registered it for, QemuServer/Network.pm
// create_ifaces_ipams_ips; an entry added by POST .../ips names a MAC and
// no VM, Ips.pm ipcreate). Entries of other vnets are dropped here.
func (c *Client) IPAMAddresses(ctx context.Context, vnets []string) ([]sandbox.IPAMAddress, error) {
	want := map[string]bool{}
	for _, v := range vnets {
		want[v] = true
	}
	return c.ipamIPv4(ctx, func(e ipamEntry) bool { return want[e.VNet] && (e.VMID > 0 || e.MAC != "") })
}

// MACEntries implements sandbox.Proxmox: the IPv4 entries of the pve
// IPAM whose MAC is one of macs, in any case, on every vnet the token may
// audit (GET /cluster/sdn/ipams/pve/status lists the entries of every
// zone with the pve IPAM and DHCP whose vnet has SDN.Audit or
// SDN.Allocate: pve-network API2/Network/SDN/Ipams.pm ipamindex;
// pve-access-setup grants them on /sdn/zones, so every zone of the
// cluster).
func (c *Client) MACEntries(ctx context.Context, macs []string) ([]sandbox.IPAMAddress, error) {
	want := map[string]bool{}
	for _, m := range macs {
		want[strings.ToLower(m)] = true
	}
	return c.ipamIPv4(ctx, func(e ipamEntry) bool { return e.MAC != "" && want[strings.ToLower(e.MAC)] })
}

// ipamIPv4 lists the IPv4 entries of the pve IPAM, gateways excepted,
// that keep takes (MACs in lower case; VMID 0 for an entry naming none).
func (c *Client) ipamIPv4(ctx context.Context, keep func(ipamEntry) bool) ([]sandbox.IPAMAddress, error) {
	var es []ipamEntry
	if err := c.c.Get(ctx, "/cluster/sdn/ipams/pve/status", &es); err != nil {
		return nil, classify("list ipam entries", err)
	}
	var out []sandbox.IPAMAddress
	for _, e := range es {
		if e.Gateway != 0 || !keep(e) {
			continue
		}
		ip, err := netip.ParseAddr(e.IP)
		if err != nil || !ip.Is4() {
			continue
		}
		out = append(out, sandbox.IPAMAddress{VNet: e.VNet, VMID: max(int(e.VMID), 0), IP: ip, MAC: strings.ToLower(e.MAC)})
	}
	return out, nil
}

// ReserveIP implements sandbox.Proxmox: POST /cluster/sdn/vnets/{vnet}/ips
// (pve-network API2/Network/SDN/Ips.pm ipcreate: SDN.Allocate on
// /sdn/zones/{zone}/{vnet}). Vnets.pm add_ip finds the vnet's running
// subnet of ip ("can't find any subnet for ip" when none, so only after
// the SDN apply); Ipams/PVEPlugin.pm add_ip refuses an ip it holds ("IP
// '..' already exist", the gateway's too) and stores the MAC as sent, no
// vmid; Subnets.pm add_ip caches ip as the MAC's address (Ipams.pm
// add_cache_mac_ip).
func (c *Client) ReserveIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error {
	body := map[string]any{"zone": zone, "ip": ip.String()}
	if mac != "" {
		body["mac"] = mac
	}
	return c.call(ctx, "POST", "reserve ipam entry "+ip.String(), "/cluster/sdn/vnets/"+url.PathEscape(vnet)+"/ips", body)
}

// ReleaseIP implements sandbox.Proxmox: DELETE
// /cluster/sdn/vnets/{vnet}/ips (Ips.pm ipdelete; PVEPlugin.pm del_ip
// refuses an ip it does not hold: ErrNotFound), with mac so that
// Subnets.pm del_ip drops the MAC's cached address too (Ipams.pm
// del_cache_mac_ip).
func (c *Client) ReleaseIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error {
	q := url.Values{"zone": {zone}, "ip": {ip.String()}}
	if mac != "" {
		q.Set("mac", mac)
	}
	return c.call(ctx, "DELETE", "delete ipam entry "+ip.String(), "/cluster/sdn/vnets/"+url.PathEscape(vnet)+"/ips?"+q.Encode(), nil)
}

// clearIPAM deletes the pve IPAM's entries of vnet inside cidr, the
// subnet's gateway entry excepted (del_subnet tolerates it).
func (c *Client) clearIPAM(ctx context.Context, vnet, zone, cidr string) error {
	var es []ipamEntry
	if err := c.c.Get(ctx, "/cluster/sdn/ipams/pve/status", &es); err != nil {
		if proxmox.IsNotFound(err) {
			return nil
		}
		return classify("list ipam entries", err)
	}
	for _, e := range es {
		if e.VNet != vnet || e.Subnet != cidr || e.Gateway != 0 || e.IP == "" {
			continue
		}
		if zone == "" {
			zone = e.Zone
		}
		q := url.Values{"zone": {zone}, "ip": {e.IP}}
		if e.MAC != "" {
			q.Set("mac", e.MAC)
		}
		err := c.call(ctx, "DELETE", "delete ipam entry "+e.IP, "/cluster/sdn/vnets/"+url.PathEscape(vnet)+"/ips?"+q.Encode(), nil)
		if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			return err
		}
	}
	return nil
}

// vnet is a vnet as GET /cluster/sdn/vnets?pending=1 lists it. A vnet
// created or changed but not applied keeps only "vnet" and "type" (and
// "state") at the top level and the rest under "pending" (pve-network
// PVE/Network/SDN.pm pending_config).
type vnet struct {
	ID      string `json:"vnet"`
	Zone    string `json:"zone"`
	Alias   string `json:"alias"`
	Pending *struct {
		Zone  string `json:"zone"`
		Alias string `json:"alias"`
	} `json:"pending"`
}

func (c *Client) vnets(ctx context.Context) ([]vnet, error) {
	var vs []vnet
	if err := c.c.Get(ctx, "/cluster/sdn/vnets?pending=1", &vs); err != nil {
		return nil, classify("list vnets", err)
	}
	for i := range vs {
		if p := vs[i].Pending; p != nil {
			if vs[i].Zone == "" {
				vs[i].Zone = p.Zone
			}
			if vs[i].Alias == "" {
				vs[i].Alias = p.Alias
			}
		}
	}
	return vs, nil
}

// ListVNets implements sandbox.Proxmox.
func (c *Client) ListVNets(ctx context.Context) ([]sandbox.VNetInfo, error) {
	vs, err := c.vnets(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.VNetInfo, len(vs))
	for i, v := range vs {
		out[i] = sandbox.VNetInfo{ID: v.ID, Zone: v.Zone, Alias: v.Alias}
	}
	return out, nil
}

// ZoneType implements sandbox.ZoneTyper: the zone's type as GET
// /cluster/sdn/zones?pending=1 lists it (pve-network API2/Network/SDN/
// Zones.pm index; a zone's type is its section type, never pending, at
// the entry's top level: SDN.pm pending_config). ErrNotFound when the
// token lists no such zone.
func (c *Client) ZoneType(ctx context.Context, zone string) (string, error) {
	var zs []struct {
		Zone string `json:"zone"`
		Type string `json:"type"`
	}
	if err := c.c.Get(ctx, "/cluster/sdn/zones?pending=1", &zs); err != nil {
		return "", classify("list zones", err)
	}
	for _, z := range zs {
		if z.Zone == zone {
			return z.Type, nil
		}
	}
	return "", fmt.Errorf("zone %s: %w", zone, sandbox.ErrNotFound)
}

// VNetSubnets implements sandbox.Proxmox.
func (c *Client) VNetSubnets(ctx context.Context, vn string) ([]string, error) {
	ss, err := c.subnets(ctx, vn)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range ss {
		out = append(out, s.CIDR)
	}
	return out, nil
}

// ListSubnetCIDRs lists the CIDRs of every subnet of the cluster: the
// vnets, then each one's subnets (the engine reads them through its cache,
// sandbox/subnetview.go; tests and tools read them all at once).
func (c *Client) ListSubnetCIDRs(ctx context.Context) ([]string, error) {
	vs, err := c.vnets(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range vs {
		cs, err := c.VNetSubnets(ctx, v.ID)
		if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			return nil, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// EnsurePool implements sandbox.Proxmox: it finds the pool and never
// creates it. Creating a pool needs Pool.Allocate on /pool/<pool>
// (pve-manager PVE/API2/Pool.pm create_pool), which the token does not
// get: pve-access-setup creates the pool before it grants the token on
// it. The token lists only pools it has Pool.Audit on (Pool.pm index), so
// a pool it has no grant on is missing too.
func (c *Client) EnsurePool(ctx context.Context, pool string) error {
	var ps []struct {
		ID string `json:"poolid"`
	}
	if err := c.c.Get(ctx, "/pools", &ps); err != nil {
		return classify("list pools", err)
	}
	for _, p := range ps {
		if p.ID == pool {
			return nil
		}
	}
	return fmt.Errorf("pool %q does not exist, or the token has no grant on it: run pve-access-setup (/usr/lib/pve-inspectd/pve-access-setup, with PVE_INSPECTD_POOL=%s for a pool of another name): it creates the pool and grants the token on it", pool, pool)
}

// fwRule is a firewall rule as Proxmox lists it.
type fwRule struct {
	Pos     flexInt `json:"pos"`
	Type    string  `json:"type"`
	Action  string  `json:"action"`
	Proto   string  `json:"proto"`
	DPort   string  `json:"dport"`
	SPort   string  `json:"sport"`
	Iface   string  `json:"iface"`
	Comment string  `json:"comment"`
	Enable  flexInt `json:"enable"`
	Digest  string  `json:"digest"`
}

// NodeRules implements mgmtport.Firewall.
func (c *Client) NodeRules(ctx context.Context) ([]mgmtport.Rule, error) {
	var rs []fwRule
	if err := c.c.Get(ctx, "/nodes/"+url.PathEscape(c.node)+"/firewall/rules", &rs); err != nil {
		return nil, classify("list node firewall rules", err)
	}
	out := make([]mgmtport.Rule, len(rs))
	for i, r := range rs {
		out[i] = mgmtport.Rule{Pos: int(r.Pos), Type: r.Type, Action: r.Action, Proto: r.Proto, DPort: r.DPort, SPort: r.SPort, Iface: r.Iface, Comment: r.Comment, Enable: r.Enable != 0, Digest: r.Digest}
	}
	return out, nil
}

// AddNodeRule implements mgmtport.Firewall (Proxmox inserts at the top).
func (c *Client) AddNodeRule(ctx context.Context, r mgmtport.Rule) error {
	body := map[string]any{"type": r.Type, "action": r.Action, "enable": boolInt(r.Enable), "comment": r.Comment}
	if r.Proto != "" {
		body["proto"] = r.Proto
	}
	if r.DPort != "" {
		body["dport"] = r.DPort
	}
	if r.SPort != "" {
		body["sport"] = r.SPort
	}
	if r.Iface != "" {
		body["iface"] = r.Iface
	}
	return c.call(ctx, "POST", "add node firewall rule", "/nodes/"+url.PathEscape(c.node)+"/firewall/rules", body)
}

// DeleteNodeRule implements mgmtport.Firewall: with the digest of the
// list pos was read from, so Proxmox refuses the delete when the list
// changed since (pve-firewall PVE/API2/Firewall/Rules.pm delete_rule:
// assert_if_modified).
func (c *Client) DeleteNodeRule(ctx context.Context, pos int, digest string) error {
	if digest == "" {
		return fmt.Errorf("delete node firewall rule %d: no digest of the list it was read from", pos)
	}
	p := fmt.Sprintf("/nodes/%s/firewall/rules/%d?%s", url.PathEscape(c.node), pos, url.Values{"digest": {digest}}.Encode())
	return c.call(ctx, "DELETE", fmt.Sprintf("delete node firewall rule %d", pos), p, nil)
}

func (c *Client) fwEnabled(ctx context.Context, path string) (bool, error) {
	var o struct {
		Enable flexInt `json:"enable"`
	}
	if err := c.c.Get(ctx, path, &o); err != nil {
		return false, classify("read "+path, err)
	}
	return o.Enable != 0, nil
}

// NodeFirewallEnabled implements mgmtport.Firewall.
func (c *Client) NodeFirewallEnabled(ctx context.Context) (bool, error) {
	return c.fwEnabled(ctx, "/nodes/"+url.PathEscape(c.node)+"/firewall/options")
}

// SetNodeFirewall implements mgmtport.Firewall.
func (c *Client) SetNodeFirewall(ctx context.Context, on bool) error {
	return c.call(ctx, "PUT", "set node firewall", "/nodes/"+url.PathEscape(c.node)+"/firewall/options", map[string]any{"enable": boolInt(on)})
}

// ClusterFirewallEnabled implements mgmtport.Firewall.
func (c *Client) ClusterFirewallEnabled(ctx context.Context) (bool, error) {
	return c.fwEnabled(ctx, "/cluster/firewall/options")
}

// SetClusterFirewall turns the cluster firewall on or off. It needs
// Sys.Modify on "/", which the daemon's token does not have (see
// mgmtport.ErrClusterFirewallOff): for root's tools.
func (c *Client) SetClusterFirewall(ctx context.Context, on bool) error {
	return c.call(ctx, "PUT", "set cluster firewall", "/cluster/firewall/options", map[string]any{"enable": boolInt(on)})
}
