package pveemu

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

const templateID = 9000

type env struct {
	t            *testing.T
	s            *Server
	fb           *FakeBackend
	ts           *httptest.Server
	ticket, csrf string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, Options{})
}

// newEnvWith is newEnv with o's Release (the other options are newEnv's).
func newEnvWith(t *testing.T, o Options) *env {
	t.Helper()
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	fb := NewFakeBackend(run)
	s, err := New(Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), Release: o.Release})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(s)
	t.Cleanup(func() {
		ts.Close()
		_ = s.Close()
		_ = fb.Close()
	})
	disk := filepath.Join(dir, "template-disk")
	if err := os.MkdirAll(filepath.Join(disk, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(disk, "var", "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(disk, "etc", "hostname"), []byte("template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTemplate(context.Background(), templateID, "tmpl", disk, map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=vnet1"}); err != nil {
		t.Fatal(err)
	}
	ticket, csrf := s.RootTicket()
	return &env{t: t, s: s, fb: fb, ts: ts, ticket: ticket, csrf: csrf}
}

type resp struct {
	status int
	reason string
	body   map[string]any
}

func (r resp) errors() map[string]string {
	out := map[string]string{}
	if m, ok := r.body["errors"].(map[string]any); ok {
		for k, v := range m {
			out[k], _ = v.(string)
		}
	}
	return out
}

// auth modes for do
type authMode int

const (
	authTicket authMode = iota
	authTicketNoCSRF
	authNone
)

func (e *env) do(method, path string, form url.Values, mode authMode, header ...string) resp {
	e.t.Helper()
	var body io.Reader
	u := e.ts.URL + "/api2/json" + path
	if form != nil {
		if method == http.MethodGet || method == http.MethodDelete {
			u += "?" + form.Encode()
		} else {
			body = strings.NewReader(form.Encode())
		}
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	switch mode {
	case authTicket:
		req.Header.Set("Cookie", "PVEAuthCookie="+url.QueryEscape(e.ticket))
		req.Header.Set("CSRFPreventionToken", e.csrf)
	case authTicketNoCSRF:
		req.Header.Set("Cookie", "PVEAuthCookie="+url.QueryEscape(e.ticket))
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := resp{status: res.StatusCode, reason: strings.TrimSpace(strings.TrimPrefix(res.Status, http.StatusText(0)))}
	_, r.reason, _ = strings.Cut(res.Status, " ")
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.t.Fatalf("%s %s: body %q: %v", method, path, raw, err)
		}
	}
	return r
}

// ok asserts success and returns data.
func (e *env) ok(method, path string, form url.Values) any {
	e.t.Helper()
	r := e.do(method, path, form, authTicket)
	if r.status != 200 {
		e.t.Fatalf("%s %s: %d %s %v", method, path, r.status, r.reason, r.body)
	}
	return r.body["data"]
}

// task runs an async call and waits for its task; returns the exitstatus.
func (e *env) task(method, path string, form url.Values) string {
	e.t.Helper()
	upid, ok := e.ok(method, path, form).(string)
	if !ok {
		e.t.Fatalf("%s %s: no UPID", method, path)
	}
	return e.wait(upid)
}

func (e *env) wait(upid string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := e.s.WaitTask(ctx, upid)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *env) setupZone() {
	e.t.Helper()
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"sbx1"}, "type": {"simple"}, "ipam": {"pve"}, "dhcp": {"dnsmasq"}})
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet1"}, "zone": {"sbx1"}})
	e.ok("POST", "/cluster/sdn/vnets/vnet1/subnets", url.Values{"subnet": {"10.10.1.0/24"}, "type": {"subnet"}, "gateway": {"10.10.1.1"}, "snat": {"1"},
		"dhcp-range": {"start-address=10.10.1.100,end-address=10.10.1.200"}})
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		e.t.Fatalf("sdn apply: %s", st)
	}
}

func (e *env) clone(newid string) {
	e.t.Helper()
	if st := e.task("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {newid}}); st != "OK" {
		e.t.Fatalf("clone: %s", st)
	}
}

func TestParameterVerification(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("a", 61441)
	tests := []struct {
		name         string
		method, path string
		form         url.Values
		param, msg   string
	}{
		{"unknown parameter", "POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"101"}, "bogus": {"1"}},
			"bogus", "property is not defined in schema and the schema does not allow additional properties"},
		{"integer type", "POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"abc"}},
			"newid", "type check ('integer') failed - got 'abc'"},
		{"boolean is 0 or 1", "POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"101"}, "full": {"true"}},
			"full", "type check ('boolean') failed - got 'true'"},
		{"vmid minimum", "POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"99"}},
			"newid", "invalid format - value does not look like a valid VM ID\n"},
		{"missing required", "POST", "/nodes/pve/qemu/9000/clone", url.Values{},
			"newid", "property is missing and it is not optional"},
		{"bad zone id", "POST", "/cluster/sdn/zones", url.Values{"zone": {"bad_zone"}, "type": {"simple"}},
			"zone", "invalid format - zone ID 'bad_zone' contains illegal characters\n"},
		{"zone id too long", "POST", "/cluster/sdn/zones", url.Values{"zone": {"abcdefghi"}, "type": {"simple"}},
			"zone", "invalid format - zone ID 'abcdefghi' can't be more length than 8 characters\n"},
		{"zone type enum", "POST", "/cluster/sdn/zones", url.Values{"zone": {"z1"}, "type": {"bogus"}},
			"type", "value 'bogus' does not have a value in the enumeration 'evpn, faucet, qinq, simple, vlan, vxlan'"},
		{"file-write maxLength", "POST", "/nodes/pve/qemu/9000/agent/file-write", url.Values{"file": {"/x"}, "content": {long}},
			"content", "value may only be 61440 characters long"},
		{"bad node name", "GET", "/nodes/bad_node/qemu", nil,
			"node", "invalid format - value does not look like a valid node name\n"},
		{"property string key", "PUT", "/nodes/pve/qemu/9000/config", url.Values{"net0": {"virtio,bogus=1"}},
			"net0", "invalid format - invalid key in comma-separated list property: bogus\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, tc.form, authTicket)
			if r.status != 400 || r.reason != "Parameter verification failed." {
				t.Fatalf("got %d %q, want 400 Parameter verification failed.", r.status, r.reason)
			}
			if got := r.errors()[tc.param]; got != tc.msg {
				t.Fatalf("errors[%s] = %q, want %q (all: %v)", tc.param, got, tc.msg, r.errors())
			}
			if _, ok := r.body["data"]; !ok || r.body["data"] != nil {
				t.Fatalf("body lacks data:null: %v", r.body)
			}
		})
	}
	// Every refused request is recorded as a violation, so a client test
	// that sends a bad request cannot pass unnoticed.
	if got := len(e.s.Violations()); got != len(tests) {
		t.Fatalf("violations = %d, want %d", got, len(tests))
	}
	// A request that passes changes state and is no violation.
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"z1"}, "type": {"simple"}})
	if got := len(e.s.Violations()); got != len(tests) {
		t.Fatalf("valid request counted as violation")
	}
}

func TestAuthentication(t *testing.T) {
	e := newEnv(t)
	if err := e.s.AddPool("sbx", ""); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddUser("agent@pve", "pw"); err != nil {
		t.Fatal(err)
	}
	tokID, secret, err := e.s.AddToken("agent@pve", "daemon", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"agent@pve", tokID} {
		if err := e.s.SetACL("/pool/sbx", subj, "PVEVMAdmin", true); err != nil {
			t.Fatal(err)
		}
	}
	e.clone("101")
	e.ok("PUT", "/pools/sbx", url.Values{"vms": {"101"}})
	token := "PVEAPIToken=" + tokID + "=" + secret

	t.Run("no ticket", func(t *testing.T) {
		r := e.do("GET", "/nodes", nil, authNone)
		if r.status != 401 || r.reason != "No ticket" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
	})
	t.Run("write without CSRF token", func(t *testing.T) {
		r := e.do("POST", "/cluster/sdn/zones", url.Values{"zone": {"z2"}, "type": {"simple"}}, authTicketNoCSRF)
		if r.status != 401 || r.reason != "Permission denied - invalid csrf token" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
		r = e.do("GET", "/cluster/sdn/zones", url.Values{"pending": {"1"}}, authTicket)
		if d, _ := r.body["data"].([]any); len(d) != 0 {
			t.Fatalf("refused write changed state: %v", d)
		}
	})
	t.Run("read without CSRF token", func(t *testing.T) {
		if r := e.do("GET", "/nodes", nil, authTicketNoCSRF); r.status != 200 {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
	})
	t.Run("bad token secret", func(t *testing.T) {
		r := e.do("GET", "/nodes", nil, authNone, "Authorization", "PVEAPIToken="+tokID+"=wrong")
		if r.status != 401 || r.reason != "Authentication failed!" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
	})
	t.Run("token inside its pool", func(t *testing.T) {
		r := e.do("GET", "/nodes/pve/qemu/101/status/current", nil, authNone, "Authorization", token)
		if r.status != 200 {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
	})
	t.Run("token outside its pool", func(t *testing.T) {
		r := e.do("GET", "/nodes/pve/qemu/9000/status/current", nil, authNone, "Authorization", token)
		if r.status != 403 || r.reason != "Permission check failed (/vms/9000, VM.Audit)" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
		r = e.do("POST", "/nodes/pve/qemu/9000/status/start", nil, authNone, "Authorization", token)
		if r.status != 403 || r.reason != "Permission check failed (/vms/9000, VM.PowerMgmt)" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
	})
	t.Run("token lists only its pool", func(t *testing.T) {
		r := e.do("GET", "/cluster/resources", url.Values{"type": {"vm"}}, authNone, "Authorization", token)
		d, _ := r.body["data"].([]any)
		if r.status != 200 || len(d) != 1 || d[0].(map[string]any)["vmid"] != float64(101) {
			t.Fatalf("got %d %v", r.status, d)
		}
	})
	t.Run("privilege separation", func(t *testing.T) {
		// The user may audit the template through a direct ACL; the
		// privsep token, without that ACL, still may not.
		if err := e.s.SetACL("/vms/9000", "agent@pve", "PVEAuditor", false); err != nil {
			t.Fatal(err)
		}
		r := e.do("GET", "/nodes/pve/qemu/9000/status/current", nil, authNone, "Authorization", token)
		if r.status != 403 {
			t.Fatalf("privsep token got %d", r.status)
		}
		ut, uc, err := e.s.Ticket("agent@pve")
		if err != nil {
			t.Fatal(err)
		}
		r = e.do("GET", "/nodes/pve/qemu/9000/status/current", nil, authNone, "Cookie", "PVEAuthCookie="+url.QueryEscape(ut), "CSRFPreventionToken", uc)
		if r.status != 200 {
			t.Fatalf("user got %d %q", r.status, r.reason)
		}
	})
	t.Run("token clones into its pool", func(t *testing.T) {
		form := url.Values{"newid": {"120"}, "pool": {"sbx"}}
		r := e.do("POST", "/nodes/pve/qemu/9000/clone", form, authNone, "Authorization", token)
		if r.status != 403 || r.reason != "Permission check failed (/vms/9000, VM.Clone)" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
		for _, subj := range []string{"agent@pve", tokID} {
			if err := e.s.SetACL("/vms/9000", subj, "PVEVMAdmin", false); err != nil {
				t.Fatal(err)
			}
		}
		// Every disk needs Datastore.AllocateSpace on its storage, which
		// the pool's ACL reaches only once the storage is a pool member.
		r = e.do("POST", "/nodes/pve/qemu/9000/clone", form, authNone, "Authorization", token)
		if r.status != 403 || r.reason != "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)" {
			t.Fatalf("clone without the storage grant: %d %q", r.status, r.reason)
		}
		for _, subj := range []string{"agent@pve", tokID} {
			if err := e.s.SetACL("/pool/sbx", subj, "PVEDatastoreUser", true); err != nil {
				t.Fatal(err)
			}
		}
		if r = e.do("POST", "/nodes/pve/qemu/9000/clone", form, authNone, "Authorization", token); r.status != 403 {
			t.Fatalf("pool ACL reached a storage outside the pool: %d %q", r.status, r.reason)
		}
		if err := e.s.AddPoolStorage("sbx", "local-lvm"); err != nil {
			t.Fatal(err)
		}
		// The template's NIC needs SDN.Use on its bridge (check_bridge_access).
		r = e.do("POST", "/nodes/pve/qemu/9000/clone", form, authNone, "Authorization", token)
		if r.status != 403 || r.reason != "Permission check failed (/sdn/zones/localnetwork/vnet1, SDN.Use)" {
			t.Fatalf("clone without SDN.Use on the template's bridge: %d %q", r.status, r.reason)
		}
		for _, subj := range []string{"agent@pve", tokID} {
			if err := e.s.SetACL("/sdn/zones/localnetwork", subj, "PVESDNUser", true); err != nil {
				t.Fatal(err)
			}
		}
		r = e.do("POST", "/nodes/pve/qemu/9000/clone", form, authNone, "Authorization", token)
		upid, _ := r.body["data"].(string)
		if r.status != 200 || e.wait(upid) != "OK" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
		if !strings.Contains(upid, ":qmclone:9000:"+tokID+":") {
			t.Fatalf("UPID user is not the token: %s", upid)
		}
		r = e.do("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil, authNone, "Authorization", token)
		if r.status != 200 {
			t.Fatalf("token cannot read its own task: %d %q", r.status, r.reason)
		}
		r = e.do("GET", "/nodes/pve/qemu/120/config", nil, authNone, "Authorization", token)
		if r.status != 200 {
			t.Fatalf("clone not in the token's pool: %d %q", r.status, r.reason)
		}
		// Without the pool parameter the token needs VM.Allocate on the
		// new VMID itself, which it does not have.
		r = e.do("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"121"}}, authNone, "Authorization", token)
		if r.status != 403 {
			t.Fatalf("clone outside the pool: %d %q", r.status, r.reason)
		}
	})
	t.Run("ticket login", func(t *testing.T) {
		r := e.do("POST", "/access/ticket", url.Values{"username": {"agent@pve"}, "password": {"pw"}}, authNone)
		d, _ := r.body["data"].(map[string]any)
		if r.status != 200 || d["ticket"] == nil || d["CSRFPreventionToken"] == nil {
			t.Fatalf("got %d %v", r.status, r.body)
		}
		r = e.do("POST", "/access/ticket", url.Values{"username": {"agent@pve"}, "password": {"nope"}}, authNone)
		if r.status != 401 {
			t.Fatalf("bad password got %d", r.status)
		}
	})
}

func TestConfigChangeDuringCloneLock(t *testing.T) {
	e := newEnv(t)
	reserved, release := make(chan struct{}), make(chan struct{})
	e.s.hooks.cloneReserved = func(string, int) { close(reserved); <-release }
	upid, _ := e.ok("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"105"}}).(string)
	<-reserved
	r := e.do("PUT", "/nodes/pve/qemu/105/config", url.Values{"memory": {"1024"}}, authTicket)
	if r.status != 500 || r.reason != "VM is locked (clone)" || r.body["message"] != "VM is locked (clone)\n" {
		t.Fatalf("got %d %q %v", r.status, r.reason, r.body)
	}
	st := e.ok("GET", "/nodes/pve/qemu/105/status/current", nil).(map[string]any)
	if st["lock"] != "clone" {
		t.Fatalf("status lock = %v", st["lock"])
	}
	// The async variant accepts and its task fails the same way.
	if got := e.task("POST", "/nodes/pve/qemu/105/config", url.Values{"memory": {"1024"}}); got != "VM is locked (clone)" {
		t.Fatalf("async config task: %q", got)
	}
	close(release)
	if got := e.wait(upid); got != "OK" {
		t.Fatalf("clone: %s", got)
	}
	e.ok("PUT", "/nodes/pve/qemu/105/config", url.Values{"memory": {"1024"}})
	conf := e.ok("GET", "/nodes/pve/qemu/105/config", nil).(map[string]any)
	if conf["memory"] != "1024" || conf["lock"] != nil || !strings.Contains(conf["scsi0"].(string), "base-9000-disk-0/vm-105-disk-0") {
		t.Fatalf("config after clone: %v", conf)
	}
	r = e.do("GET", "/nodes/pve/qemu/106/config", nil, authTicket)
	if r.status != 500 || r.reason != "Configuration file 'nodes/pve/qemu-server/106.conf' does not exist" {
		t.Fatalf("got %d %q", r.status, r.reason)
	}
}

func TestConcurrentClonesSameNextID(t *testing.T) {
	e := newEnv(t)
	next := e.ok("GET", "/cluster/nextid", nil).(string)
	if again := e.ok("GET", "/cluster/nextid", nil).(string); again != next {
		t.Fatalf("nextid reserved an id: %s then %s", next, again)
	}
	gate := make(chan struct{})
	e.s.hooks.cloneTaskStart = func(int) { <-gate }
	var upids [2]string
	var wg sync.WaitGroup
	for i := range upids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			upids[i], _ = e.ok("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {next}}).(string)
		}()
	}
	wg.Wait()
	close(gate) // both clones passed the early check; now let them race
	var results []string
	for _, u := range upids {
		results = append(results, e.wait(u))
	}
	okCount, failMsg := 0, ""
	for _, r := range results {
		if r == "OK" {
			okCount++
		} else {
			failMsg = r
		}
	}
	want := "unable to create VM " + next + ": config file already exists"
	if okCount != 1 || failMsg != want {
		t.Fatalf("results %q, want one OK and one %q", results, want)
	}
	// The loser's task log ends like Proxmox's.
	for _, u := range upids {
		log := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(u)+"/log", nil).([]any)
		last := log[len(log)-1].(map[string]any)["t"].(string)
		if last != "TASK OK" && last != "TASK ERROR: "+want {
			t.Fatalf("last log line %q", last)
		}
	}
	// A third clone to the now taken id fails before forking a task.
	r := e.do("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {next}}, authTicket)
	if r.status != 500 || r.reason != want {
		t.Fatalf("got %d %q", r.status, r.reason)
	}
}

func TestAgentAvailability(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	e.clone("101")
	r := e.do("POST", "/nodes/pve/qemu/101/agent/ping", nil, authTicket)
	if r.status != 500 || r.reason != "VM 101 is not running" {
		t.Fatalf("stopped VM: %d %q", r.status, r.reason)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	e.fb.SetAgentDown(101, true)
	r = e.do("POST", "/nodes/pve/qemu/101/agent/exec", url.Values{"command": {"echo", "x"}}, authTicket)
	if r.status != 500 || r.reason != "QEMU guest agent is not running" {
		t.Fatalf("agent down: %d %q", r.status, r.reason)
	}
	e.fb.SetAgentDown(101, false)
	e.ok("POST", "/nodes/pve/qemu/101/agent/ping", nil)
	e.ok("PUT", "/nodes/pve/qemu/101/config", url.Values{"delete": {"agent"}})
	r = e.do("POST", "/nodes/pve/qemu/101/agent/ping", nil, authTicket)
	if r.status != 500 || r.reason != "No QEMU guest agent configured" {
		t.Fatalf("no agent: %d %q", r.status, r.reason)
	}
	r = e.do("POST", "/nodes/pve/qemu/101/status/start", nil, authTicket)
	if st := e.wait(r.body["data"].(string)); st != "VM 101 already running" {
		t.Fatalf("double start: %q", st)
	}
}

func TestUnknownRoute(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/nodes/pve/bogus", nil, authTicket)
	if r.status != 501 || r.reason != "Method 'GET /nodes/pve/bogus' not implemented" {
		t.Fatalf("got %d %q", r.status, r.reason)
	}
	if len(e.s.Violations()) != 1 {
		t.Fatalf("unknown route not recorded as violation")
	}
}

var reUPID9 = regexp.MustCompile(`^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:qmclone:9000:root@pam:$`)

func TestTasks(t *testing.T) {
	e := newEnv(t)
	upid := e.ok("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"101"}}).(string)
	if !reUPID9.MatchString(upid) || len(strings.Split(upid, ":")) != 9 {
		t.Fatalf("UPID %q", upid)
	}
	e.wait(upid)
	st := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any)
	if st["status"] != "stopped" || st["exitstatus"] != "OK" || st["type"] != "qmclone" || st["id"] != "9000" || st["user"] != "root@pam" {
		t.Fatalf("status %v", st)
	}
	// SDN apply where the node fails a zone: the task ends with warnings.
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"z1"}, "type": {"simple"}})
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"z2"}, "type": {"simple"}})
	e.fb.FailZone("z1", errors.New("dnsmasq failed"))
	if got := e.task("PUT", "/cluster/sdn", nil); got != "WARNINGS: 1" {
		t.Fatalf("exitstatus %q", got)
	}
	if z := e.fb.Zones(); len(z) != 1 || z[0] != "z2" {
		t.Fatalf("applied zones %v", z)
	}
	e.fb.FailZone("z1", nil)
	if got := e.task("PUT", "/cluster/sdn", nil); got != "OK" {
		t.Fatalf("retry exitstatus %q", got)
	}
	// A failed task reports its error as exitstatus.
	if got := e.task("POST", "/nodes/pve/qemu/9000/status/start", nil); got != "you can't start a vm if it's a template" {
		t.Fatalf("exitstatus %q", got)
	}
}

func TestSDNPendingUntilApplied(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"sbx1"}, "type": {"simple"}})
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet1"}, "zone": {"sbx1"}})
	zones := e.ok("GET", "/cluster/sdn/zones", url.Values{"pending": {"1"}}).([]any)
	if len(zones) != 1 || zones[0].(map[string]any)["state"] != "new" {
		t.Fatalf("pending zones %v", zones)
	}
	if running := e.ok("GET", "/cluster/sdn/zones", url.Values{"running": {"1"}}).([]any); len(running) != 0 {
		t.Fatalf("running before apply: %v", running)
	}
	if len(e.fb.Zones()) != 0 {
		t.Fatal("backend changed before apply")
	}
	e.ok("POST", "/cluster/sdn/vnets/vnet1/subnets", url.Values{"subnet": {"10.10.1.0/24"}, "type": {"subnet"}, "gateway": {"10.10.1.1"}, "snat": {"1"},
		"dhcp-range": {"start-address=10.10.1.100,end-address=10.10.1.200"}})
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatal(st)
	}
	z, ok := e.fb.Zone("sbx1")
	if !ok || len(z.VNets) != 1 || z.VNets[0].Subnet.String() != "10.10.1.0/24" || z.VNets[0].Gateway.String() != "10.10.1.1" ||
		!z.VNets[0].SNAT || len(z.VNets[0].DHCP) != 1 || z.VNets[0].DHCP[0].Start.String() != "10.10.1.100" || z.VNets[0].DHCP[0].End.String() != "10.10.1.200" {
		t.Fatalf("applied zone %+v", z)
	}
	// Raised inside lock_sdn_config: wrapped, and a 500.
	r := e.do("DELETE", "/cluster/sdn/vnets/vnet1", nil, authTicket)
	if r.status != 500 || r.body["message"] != "delete sdn vnet object failed: 400 Parameter verification failed.\nvnet: Can't delete vnet if subnets exists\n" {
		t.Fatalf("got %d %v", r.status, r.body)
	}
	r = e.do("POST", "/cluster/sdn/vnets/vnet1/subnets", url.Values{"subnet": {"10.10.2.0/24"}, "type": {"subnet"}, "gateway": {"10.10.9.1"}}, authTicket)
	if r.status != 500 || r.body["message"] != "create sdn subnet object failed: 400 Parameter verification failed.\ngateway: 10.10.9.1 is not in subnet 10.10.2.0/24\n" {
		t.Fatalf("got %d %v", r.status, r.body)
	}
	e.ok("DELETE", "/cluster/sdn/vnets/vnet1/subnets/sbx1-10.10.1.0-24", nil)
	e.ok("DELETE", "/cluster/sdn/vnets/vnet1", nil)
	e.ok("DELETE", "/cluster/sdn/zones/sbx1", nil)
	zones = e.ok("GET", "/cluster/sdn/zones", url.Values{"pending": {"1"}}).([]any)
	if len(zones) != 1 || zones[0].(map[string]any)["state"] != "deleted" {
		t.Fatalf("pending after delete %v", zones)
	}
	if len(e.fb.Zones()) != 1 {
		t.Fatal("zone removed before apply")
	}
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatal(st)
	}
	if len(e.fb.Zones()) != 0 {
		t.Fatalf("zones after apply: %v", e.fb.Zones())
	}
}

func TestFirewall(t *testing.T) {
	e := newEnv(t)
	for _, base := range []string{"/cluster/firewall", "/nodes/pve/firewall"} {
		e.ok("POST", base+"/rules", url.Values{"type": {"in"}, "action": {"DROP"}, "dest": {"192.0.2.2"}, "dport": {"8006"}, "proto": {"tcp"}, "enable": {"1"}})
		e.ok("PUT", base+"/options", url.Values{"enable": {"1"}})
		rules := e.ok("GET", base+"/rules", nil).([]any)
		if len(rules) != 1 || rules[0].(map[string]any)["dport"] != "8006" {
			t.Fatalf("%s rules %v", base, rules)
		}
		if opts := e.ok("GET", base+"/options", nil).(map[string]any); opts["enable"] != float64(1) {
			t.Fatalf("%s options %v", base, opts)
		}
		r := e.do("POST", base+"/rules", url.Values{"type": {"in"}, "action": {"DROP"}, "proto": {"nope!"}}, authTicket)
		if r.status != 400 {
			t.Fatalf("%s bad proto accepted: %d", base, r.status)
		}
		// a node OUT rule on a source port and an interface (the
		// management-port converger's reply rules) is stored as given
		e.ok("POST", base+"/rules", url.Values{"type": {"out"}, "action": {"ACCEPT"}, "proto": {"tcp"}, "sport": {"8006"}, "iface": {"vmbr0"}, "enable": {"1"}})
		rules = e.ok("GET", base+"/rules", nil).([]any)
		if o := rules[0].(map[string]any); len(rules) != 2 || o["type"] != "out" || o["sport"] != "8006" || o["iface"] != "vmbr0" || o["dport"] != nil {
			t.Fatalf("%s out rule %v", base, rules)
		}
		e.ok("DELETE", base+"/rules/0", nil)
		e.ok("DELETE", base+"/rules/0", nil)
		r = e.do("DELETE", base+"/rules/0", nil, authTicket)
		if r.status != 500 || r.reason != "no rule at position 0" {
			t.Fatalf("got %d %q", r.status, r.reason)
		}
	}
}

// TestResize grows a disk by a delta and to an absolute size as a task,
// and refuses to shrink it or to resize a disk that does not exist.
func TestResize(t *testing.T) {
	e := newEnv(t)
	e.clone("101")
	size := func() string {
		conf := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any)
		v, _ := conf["scsi0"].(string)
		for _, o := range strings.Split(v, ",") {
			if strings.HasPrefix(o, "size=") {
				return o
			}
		}
		return v
	}
	if st := e.task("PUT", "/nodes/pve/qemu/101/resize", url.Values{"disk": {"scsi0"}, "size": {"+2G"}}); st != "OK" {
		t.Fatalf("grow by 2G: %s", st)
	}
	if got := size(); got != "size=10G" {
		t.Fatalf("after +2G: %s, want size=10G", got)
	}
	if st := e.task("PUT", "/nodes/pve/qemu/101/resize", url.Values{"disk": {"scsi0"}, "size": {"20G"}}); st != "OK" {
		t.Fatalf("grow to 20G: %s", st)
	}
	if got := size(); got != "size=20G" {
		t.Fatalf("after 20G: %s", got)
	}
	for _, c := range []struct{ size, disk, reason string }{
		{"4G", "scsi0", "shrinking disks is not supported"},
		{"30G", "scsi5", "disk 'scsi5' does not exist"},
	} {
		r := e.do("PUT", "/nodes/pve/qemu/101/resize", url.Values{"disk": {c.disk}, "size": {c.size}}, authTicket)
		if r.status != 500 || r.reason != c.reason {
			t.Errorf("resize %s %s: %d %q, want 500 %q", c.disk, c.size, r.status, r.reason, c.reason)
		}
	}
	if got := size(); got != "size=20G" {
		t.Fatalf("a refused resize changed the disk: %s", got)
	}
	r := e.do("PUT", "/nodes/pve/qemu/101/resize", url.Values{"disk": {"scsi0"}, "size": {"big"}}, authTicket)
	if r.status != 400 {
		t.Errorf("size 'big': %d %q, want 400 from the schema", r.status, r.reason)
	}
}

// TestDescriptionParameter: a parameter named description (a config key)
// is part of the schema, not documentation the extract drops: the
// emulator takes it, as Proxmox does.
func TestDescriptionParameter(t *testing.T) {
	e := newEnv(t)
	e.ok("PUT", "/nodes/pve/qemu/9000/config", url.Values{"description": {"a template"}})
	if c, _ := e.ok("GET", "/nodes/pve/qemu/9000/config", nil).(map[string]any); c["description"] != "a template" {
		t.Errorf("config %v", c)
	}
}
