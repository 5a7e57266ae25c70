package pveemu

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures a Server.
type Options struct {
	// Node is the node name ("pve" when empty).
	Node string
	// Backend runs zones and guests. Required.
	Backend Backend
	// Agent talks to guest agents; nil uses the built-in qemu-ga client.
	Agent Agent
	// DataDir holds VM disk directories and snapshots. Required.
	DataDir string
	// StoragePath is where the client sees the dir storage "local"
	// (DataDir/storage/local): its storage.cfg path and the path of every
	// volume the API reports are under it. A real node's local is
	// /var/lib/vz; a daemon in a container that has DataDir/storage/local
	// bound at /var/lib/vz sets that. Empty reports the directory itself.
	StoragePath string
	// Logger receives task and request logs (discarded when nil).
	Logger *slog.Logger
	// RootPassword is root@pam's password for POST /access/ticket
	// (a random one when empty; mint tickets with RootTicket instead).
	RootPassword string
	// StatsInterval is how often the VM statistics GET /cluster/resources
	// reports (name, status, template, uptime, ...) are refreshed, like
	// pvestatd's update loop: 10 s when zero. Between refreshes they are
	// stale, and a VM created since the last one is "unknown" without a
	// name. Negative makes them live (for tests of other things only).
	StatsInterval time.Duration
	// Cluster are the other nodes of the cluster Node is one of; empty for
	// a single node. Serve each node's API with NodeHandler.
	Cluster []ClusterNode
	// Release is the Proxmox VE release the emulator behaves as: Release91
	// (the default when empty) or Release92 (FIDELITY.md, issue 35).
	Release Release
	// ReloadCost is what one node's network reload costs within an SDN
	// apply (zero: nothing, for tests of other things). See ReloadCost.
	ReloadCost ReloadCost
}

// ReloadCost models the time of one node's network reload in an SDN
// apply, as pve-network's sources spend it: a fixed part (the staged
// interfaces rename, the network config regeneration, ifreload -a) and
// three systemctl calls for every zone with DHCP in the whole cluster's
// running config, not only the zones of that node (Dhcp.pm
// regenerate_config has no node filter; Dnsmasq.pm after_configure
// reloads dbus, enables and restarts dnsmasq@<zone>). The apply's worker
// visits the cluster's nodes one after another, so an apply of Z DHCP
// zones on N nodes takes about N × (PerNode + Z × PerDHCPZone). The
// dnsmasqs of the node stay stopped for the whole reload (FIDELITY.md,
// issue 36 item 10).
type ReloadCost struct {
	// PerNode is the fixed part of a node's reload.
	PerNode time.Duration
	// PerDHCPZone is the cost of one DHCP zone's three systemctl calls.
	PerDHCPZone time.Duration
}

// of is the time a node's reload takes with dhcpZones DHCP zones in the
// cluster's running config.
func (c ReloadCost) of(dhcpZones int) time.Duration {
	return c.PerNode + time.Duration(dhcpZones)*c.PerDHCPZone
}

// Server is the Proxmox VE API emulator. It is an http.Handler serving
// /api2/json.
type Server struct {
	node    string
	backend Backend
	agent   Agent
	// snapshotFrozen, when set, runs while a snapshot holds the agent
	// frozen (snapshotFreeze).
	snapshotFrozen func(ctx context.Context, vmid int)
	dataDir        string
	storagePath    string
	release        Release
	reloadCost     ReloadCost
	log            *slog.Logger
	schema         *Schema
	routes         []*route
	secret         []byte

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	vms     map[int]*vm
	tasks   map[string]*task
	taskSeq uint32
	pools   map[string]*pool
	users   map[string]*user
	acl     []aclEntry

	// customRoles are the roles added by AddRole (built-in ones: roles).
	customRoles map[string]map[string]bool

	sdn     sdnState
	fw      map[string]*firewall // "cluster" and "node"
	records []RequestRecord

	// permMu guards permLog, the privilege checks made while
	// recordPerms is set (RecordPermChecks).
	permMu      sync.Mutex
	recordPerms bool
	permLog     []PermCheck

	pwdRoot string
	vmLocks map[lockKey]*sync.Mutex
	// stats is what the last pvestatd-like refresh published per VM (nil
	// when StatsInterval is negative: live).
	stats map[int]map[string]any
	// ipam is the pve IPAM database: zone -> subnet CIDR -> IP -> entry.
	ipam map[string]map[string]map[string]*ipamEntry
	// macCache is Proxmox's cluster-wide cache of each MAC's address
	// (ipam.go).
	macCache map[string]*macCacheEntry
	// reloadWarnings are injected failures of the next SDN applies' network
	// reload (InjectReloadWarning).
	reloadWarnings []string
	// hotplugFailures are injected failures of the next disk hot-plug
	// per VM (FailNextHotplug).
	hotplugFailures map[int]string
	// storages are the storage IDs the node has.
	storages map[string]bool
	// storageContent overrides a storage's content types
	// (SetStorageContent).
	storageContent map[string]string
	// storageSpace overrides a storage's reported size
	// (SetStorageSpace).
	storageSpace map[string]StorageSpace
	// members are the cluster's nodes by name, nodeNames in nodeid order
	// (the primary, Options.Node, first).
	members   map[string]*clusterNode
	nodeNames []string

	// hooks let tests pause clones at defined points; nil in production.
	hooks testHooks
}

type testHooks struct {
	cloneTaskStart func(newid int)              // a clone task begins, before locking
	cloneReserved  func(node string, newid int) // "lock: clone" written, before the copy; read under mu
	reloadHeld     func(node string)            // a node's reload holds its ifreload lock, before it applies
	// ctSnapshotPrepared runs once a CT snapshot's prepare wrote "lock:
	// snapshot", ctRollbackLocked once a CT rollback wrote "lock:
	// rollback" (HoldCTSnapshots); both read under mu.
	ctSnapshotPrepared, ctRollbackLocked func(vmid int)
	// ctSnapshotFrozen runs while a CT snapshot holds the CT frozen,
	// before the copy, with the task's context; read under mu.
	ctSnapshotFrozen func(ctx context.Context, vmid int)
	// checksumHeld runs as a download-url worker begins its checksum
	// step, with the worker's context (HoldDownloadChecksums); read under
	// mu.
	checksumHeld func(ctx context.Context, tmp string)
}

// RequestRecord is one request the emulator received, as validated.
type RequestRecord struct {
	// AuthID is the user or token the request authenticated as ("" when
	// it did not).
	AuthID  string
	Method  string
	Path    string // relative to /api2/json
	Route   string // matched path template ("" when none)
	Params  map[string]any
	Status  int
	Message string
	Errors  ParamErrors
	// protected is set when the matched endpoint is protected: pveproxy
	// hands it to pvedaemon (compress.go).
	protected bool
	// Violation is set when the request did not match a schema route or
	// its parameters were refused (schema validation or a handler's
	// parameter exception; not one that is the call's answer, paramAnswer).
	Violation bool
}

type handlerFunc func(ctx context.Context, rq *request) (any, error)

type route struct {
	method string
	path   string
	segs   []string
	ep     *Endpoint
	h      handlerFunc
}

// New builds an emulator. Close it to stop its tasks.
func New(o Options) (*Server, error) {
	if o.Backend == nil {
		return nil, errors.New("pveemu: Options.Backend is required")
	}
	if o.DataDir == "" {
		return nil, errors.New("pveemu: Options.DataDir is required")
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("pveemu: data dir: %w", err)
	}
	if o.Node == "" {
		o.Node = "pve"
	}
	if err := namedFormats["pve-node"](o.Node); err != nil {
		return nil, fmt.Errorf("pveemu: node name %q: %s", o.Node, strings.TrimSpace(err.Error()))
	}
	if o.Agent == nil {
		o.Agent = &qgaClient{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	schema, err := LoadSchema()
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("pveemu: secret: %w", err)
	}
	if o.RootPassword == "" {
		o.RootPassword = randomHex(16)
	}
	if o.Release == "" {
		o.Release = Release91
	}
	if _, err := ParseRelease(string(o.Release)); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		node: o.Node, backend: o.Backend, agent: o.Agent, dataDir: o.DataDir, storagePath: o.StoragePath, release: o.Release, reloadCost: o.ReloadCost,
		log: o.Logger.With("component", "pveemu"), schema: schema, secret: secret,
		ctx: ctx, cancel: cancel,
		vms: map[int]*vm{}, tasks: map[string]*task{}, pools: map[string]*pool{},
		users: map[string]*user{}, fw: map[string]*firewall{"cluster": newFirewall(), "node": newFirewall()},
		pwdRoot: o.RootPassword, vmLocks: map[lockKey]*sync.Mutex{},
		sdn: newSDNState(), ipam: map[string]map[string]map[string]*ipamEntry{}, macCache: map[string]*macCacheEntry{},
		storages:       map[string]bool{"local": true, "local-lvm": true},
		storageContent: map[string]string{},
		storageSpace:   map[string]StorageSpace{},
	}
	if o.StatsInterval == 0 {
		o.StatsInterval = 10 * time.Second
	}
	if o.StatsInterval > 0 {
		s.stats = map[int]map[string]any{}
		s.wg.Add(1)
		go s.statsLoop(o.StatsInterval)
	}
	s.customRoles = map[string]map[string]bool{}
	s.users["root@pam"] = &user{id: "root@pam", enable: true, tokens: map[string]*token{}}
	if err := s.initNodes(o); err != nil {
		cancel()
		return nil, err
	}
	if err := s.registerRoutes(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

// Close cancels running tasks and waits for them.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// Schema is the schema extract the server validates against.
func (s *Server) Schema() *Schema { return s.schema }

// Route is one method and path template the emulator serves.
type Route struct{ Method, Path string }

// Routes lists every route the emulator serves.
func (s *Server) Routes() []Route {
	out := make([]Route, len(s.routes))
	for i, r := range s.routes {
		out[i] = Route{r.method, r.path}
	}
	return out
}

// Requests returns a copy of every request received so far.
func (s *Server) Requests() []RequestRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]RequestRecord(nil), s.records...)
}

// Violations returns the requests that matched no schema route or failed
// schema validation.
func (s *Server) Violations() []RequestRecord {
	var out []RequestRecord
	for _, r := range s.Requests() {
		if r.Violation {
			out = append(out, r)
		}
	}
	return out
}

func (s *Server) handle(method, path string, h handlerFunc) error {
	ep, ok := s.schema.Endpoint(method, path)
	if !ok {
		return fmt.Errorf("pveemu: route %s %s not in schema extract", method, path)
	}
	s.routes = append(s.routes, &route{method: method, path: path, segs: strings.Split(strings.Trim(path, "/"), "/"), ep: ep, h: h})
	return nil
}

func (s *Server) match(method, rel string) (*route, map[string]string) {
	segs := strings.Split(strings.Trim(rel, "/"), "/")
	// Below /nodes/{node}/storage/{storage}/content the rest of the path is
	// one parameter, the volume id, slashes and all (fragmentDelimiter '').
	if len(segs) > 6 && segs[0] == "nodes" && segs[2] == "storage" && segs[4] == "content" {
		segs = append(segs[:5:5], strings.Join(segs[5:], "/"))
	}
	for _, r := range s.routes {
		if r.method != method || len(r.segs) != len(segs) {
			continue
		}
		vars := map[string]string{}
		ok := true
		for i, sg := range r.segs {
			if strings.HasPrefix(sg, "{") {
				if segs[i] == "" {
					ok = false
					break
				}
				vars[strings.Trim(sg, "{}")] = segs[i]
			} else if sg != segs[i] {
				ok = false
				break
			}
		}
		if ok {
			return r, vars
		}
	}
	return nil, nil
}

// ServeHTTP implements http.Handler for /api2/json: the API of the
// primary node (Options.Node).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serveAs(w, r, s.node)
}

// serveAs answers a request to the API of node local.
func (s *Server) serveAs(w http.ResponseWriter, r *http.Request, local string) {
	rec := RequestRecord{Method: r.Method}
	data, err := s.serve(r, &rec, local)
	if err != nil {
		ae := asAPIError(err)
		rec.Status, rec.Message, rec.Errors = ae.code, ae.msg, ae.errors
		if ae.code == http.StatusBadRequest && ae.errors != nil && !ae.answer {
			rec.Violation = true
		}
		s.record(rec)
		writeError(w, ae)
		return
	}
	rec.Status = http.StatusOK
	s.record(rec)
	env := map[string]any{"data": data}
	if a, ok := data.(withAttribs); ok {
		env = map[string]any{"data": a.data}
		for k, v := range a.attribs {
			env[k] = v
		}
	}
	body, err := json.Marshal(env)
	if err != nil {
		writeError(w, asAPIError(fmt.Errorf("encode response: %w", err)))
		return
	}
	body, enc, err := compressAnswer(r.Header.Get("Accept-Encoding"), rec.protected, body)
	if err != nil {
		writeError(w, asAPIError(err))
		return
	}
	w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	if enc != "" {
		w.Header().Set("Content-Encoding", enc)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func (s *Server) record(rec RequestRecord) {
	s.mu.Lock()
	s.records = append(s.records, rec)
	s.mu.Unlock()
}

func (s *Server) serve(r *http.Request, rec *RequestRecord, local string) (_ any, err error) {
	rel, ok := strings.CutPrefix(r.URL.EscapedPath(), "/api2/json")
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		rec.Path = r.URL.Path
		rec.Violation = true
		return nil, &apiError{code: http.StatusNotImplemented, msg: "no such uri\n", bare: true}
	}
	rel, err = url.PathUnescape(rel)
	if err != nil {
		return nil, &apiError{code: http.StatusBadRequest, msg: "bad path\n", bare: true}
	}
	rec.Path = rel
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete:
	default:
		rec.Violation = true
		return nil, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("method '%s' not available\n", r.Method), bare: true}
	}
	var upload map[string]any
	if r.Method == http.MethodPost && reUploadPath.MatchString(rel) && r.ContentLength > 0 {
		// An upload is authenticated before its body is read, and the
		// body is streamed to a file (readUpload).
		authid, _, aerr := s.authenticate(r, rel)
		if aerr != nil {
			return nil, aerr
		}
		if err := s.checkPrivs(authid, "/storage/"+reUploadPath.FindStringSubmatch(rel)[2], []string{"Datastore.AllocateTemplate"}, false); err != nil {
			return nil, err
		}
		if upload, err = s.readUpload(r); err != nil {
			return nil, err
		}
		defer func() {
			// the upload's task removes the file; a refused request here
			if err != nil {
				_ = os.Remove(fmt.Sprint(upload["tmpfilename"]))
			}
		}()
	}
	if r.ContentLength > maxPost && upload == nil {
		return nil, errTooLarge
	}
	var body []byte
	if upload == nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxPost+1))
		if err != nil {
			return nil, &apiError{code: http.StatusBadRequest, msg: "unable to read request body\n", bare: true}
		}
		if len(b) > maxPost {
			return nil, errTooLarge
		}
		body = b
	}
	if len(body) > 0 && r.Method != http.MethodPost && r.Method != http.MethodPut {
		return nil, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("Unexpected content for method '%s'\n", r.Method), bare: true}
	}

	authid, isToken, err := s.authenticate(r, rel)
	if err != nil {
		return nil, err
	}
	rec.AuthID = authid

	rt, vars := s.match(r.Method, rel)
	if rt == nil {
		rec.Violation = true
		return nil, &apiError{code: http.StatusNotImplemented, msg: fmt.Sprintf("Method '%s %s' not implemented\n", r.Method, rel)}
	}
	rec.Route = rt.path
	rec.protected = rt.ep.Protected

	params := upload
	if params == nil {
		params, err = decodeParams(r, body)
		if err != nil {
			rec.Violation = true
			return nil, err
		}
	}
	for k, v := range vars {
		if old, ok := params[k]; ok {
			if s, _ := scalarString(old); s != v {
				return nil, paramFail(ParamErrors{k: "duplicate parameter (already defined in URI) with conflicting values!"})
			}
		}
		params[k] = v
	}
	rec.Params = params
	if node, ok := vars["node"]; ok && strings.HasPrefix(rt.path, "/nodes/{node}") {
		s.mu.Lock()
		err := s.checkClusterNodeLocked(node)
		s.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}

	if isToken && !rt.ep.AllowToken {
		return nil, permFail(fmt.Sprintf("URI '%s' not available with API token, need proper ticket.\n", rel))
	}
	if err := s.checkAPI2Permissions(rt.ep.Perm, authid, params); err != nil {
		return nil, err
	}
	normalizeLegacyParams(rt.ep.Params, params)
	if errs := rt.ep.Validate(params); errs != nil {
		return nil, paramFail(errs)
	}
	if err := s.checkVMNode(rt.path, vars); err != nil {
		return nil, err
	}
	return rt.h(r.Context(), &request{params: params, authid: authid, token: isToken, route: rt, local: local})
}

// writeError answers like pve-http-server: the first line of the message is
// the reason phrase; API errors carry {"data":null,"message":...,"errors":...}.
func writeError(w http.ResponseWriter, ae *apiError) {
	var body []byte
	switch {
	case ae.text:
		body = []byte(ae.msg)
	case !ae.bare:
		m := map[string]any{"data": nil, "message": ae.msg}
		if len(ae.errors) > 0 {
			m["errors"] = ae.errors
		}
		body, _ = json.Marshal(m)
	}
	reason, _, _ := strings.Cut(ae.msg, "\n")
	reason = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, reason)
	if hj, ok := w.(http.Hijacker); ok {
		conn, buf, err := hj.Hijack()
		if err == nil {
			defer conn.Close()
			fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", ae.code, reason)
			if body != nil && !ae.text {
				fmt.Fprintf(buf, "Content-Type: application/json;charset=UTF-8\r\n")
			}
			fmt.Fprintf(buf, "Content-Length: %d\r\nConnection: close\r\nDate: %s\r\n\r\n", len(body), time.Now().UTC().Format(http.TimeFormat))
			_, _ = buf.Write(body)
			_ = buf.Flush()
			return
		}
	}
	// No hijacking (HTTP/2, recorders): standard reason phrase, message in
	// the body and in a header.
	w.Header().Set("X-Pveemu-Reason", reason)
	if body != nil && !ae.text {
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
	}
	w.WriteHeader(ae.code)
	_, _ = w.Write(body)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
