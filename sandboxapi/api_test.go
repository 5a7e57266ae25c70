package sandboxapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

func twoVMs() apitype.CreateRequest {
	return apitype.CreateRequest{
		VMs:    []apitype.VMRequest{{Name: "a", Template: "debian", Cores: 2, MemoryMiB: 2048}, {Name: "b", Template: "kali", DiskGiB: 20}},
		Labels: map[string]string{"eval": "ctf-1"},
	}
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	sb := e.create(twoVMs())
	if sb.State != apitype.StateReady || len(sb.VMs) != 2 || sb.Labels["eval"] != "ctf-1" || sb.Owner != "local" {
		t.Fatalf("created sandbox: %+v", sb)
	}
	// Every VM is tagged with node and sandbox, in the pool, on the vnet.
	for _, v := range sb.VMs {
		fv, ok := e.px.VMByID(v.VMID)
		if !ok {
			t.Fatalf("vm %d missing", v.VMID)
		}
		want := []string{"pvei-n-node1", "pvei-s-" + sb.ID}
		if !slices.Equal(fv.Info.Tags, want) || fv.Info.Pool != "pve-inspect" || fv.Info.Status != "running" {
			t.Errorf("vm %d: tags %v pool %q status %s", v.VMID, fv.Info.Tags, fv.Info.Pool, fv.Info.Status)
		}
		if !slices.Equal(fv.Config.Bridges, []string{sb.Networks[0].VNet}) {
			t.Errorf("vm %d bridges %v", v.VMID, fv.Config.Bridges)
		}
	}
	if fv, _ := e.px.VMByID(sb.VMs[1].VMID); fv.DiskGiB != 20 || fv.Config.Cores != 1 || fv.Config.MemoryMiB != 1024 {
		t.Errorf("vm b config: %+v disk %d", fv.Config, fv.DiskGiB)
	}
	if fv, _ := e.px.VMByID(sb.VMs[0].VMID); fv.Config.Cores != 2 || fv.Config.MemoryMiB != 2048 {
		t.Errorf("vm a config: %+v", fv.Config)
	}
	if z, v, s := e.px.SDNObjects(); z != 1 || v != 1 || s != 1 {
		t.Errorf("sdn objects %d/%d/%d, want 1/1/1", z, v, s)
	}
	if got, p := sb.Networks[0], netip.MustParsePrefix(sb.Networks[0].CIDR); p.Bits() != 24 || !netip.MustParsePrefix("10.200.0.0/16").Contains(p.Addr()) ||
		got.Gateway != p.Addr().Next().String() || !got.DHCP || !got.SNAT {
		t.Errorf("network %+v", got)
	}

	// exec collected
	res, err := e.c.Exec(ctx, sb.ID, "a", apitype.ExecRequest{Argv: []string{"uname", "-a"}})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "Linux") {
		t.Fatalf("exec uname: %+v %v", res, err)
	}
	res, err = e.c.Exec(ctx, sb.ID, "b", apitype.ExecRequest{Argv: []string{"fail", "3"}})
	if err != nil || res.ExitCode != 3 || string(res.Stderr) != "failing\n" {
		t.Fatalf("exec fail: %+v %v", res, err)
	}
	// exec streamed: chunks arrive in order, exit record last
	var out, errb bytes.Buffer
	res, err = e.c.ExecStream(ctx, sb.ID, "a", apitype.ExecRequest{Argv: []string{"stream", "4"}}, &out, &errb)
	if err != nil || res.ExitCode != 0 || out.String() != "out 0\nout 2\n" || errb.String() != "err 1\nerr 3\n" {
		t.Fatalf("exec stream: %+v %v stdout %q stderr %q", res, err, out.String(), errb.String())
	}

	// file round trip
	data := make([]byte, 3<<20+7)
	_, _ = rand.Read(data)
	if err := e.c.WriteFile(ctx, sb.ID, "a", "/root/blob", bytes.NewReader(data), int64(len(data)), 0o600); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	n, err := e.c.ReadFile(ctx, sb.ID, "a", "/root/blob", &back)
	if err != nil || n != int64(len(data)) || sha256.Sum256(back.Bytes()) != sha256.Sum256(data) {
		t.Fatalf("read back: n=%d err=%v", n, err)
	}

	// snapshot, change, rollback: the change is gone
	if err := e.c.WriteFile(ctx, sb.ID, "b", "/etc/motd", strings.NewReader("before"), -1, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "b", "clean"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteFile(ctx, sb.ID, "b", "/etc/motd", strings.NewReader("after"), -1, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Rollback(ctx, sb.ID, "b", "clean"); err != nil {
		t.Fatal(err)
	}
	res, err = e.c.Exec(ctx, sb.ID, "b", apitype.ExecRequest{Argv: []string{"cat", "/etc/motd"}})
	if err != nil || string(res.Stdout) != "before" {
		t.Fatalf("after rollback: %+v %v", res, err)
	}

	// check
	rep, err := e.c.Check(ctx, sb.ID, "")
	if err != nil || !rep.Pass || rep.VM != "a" || rep.Sandbox != sb.ID || len(rep.Rows) != 1 {
		t.Fatalf("check: %+v %v", rep, err)
	}

	// list, get, extend
	l, err := e.c.List(ctx)
	if err != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Fatalf("list: %v %v", l, err)
	}
	e.clock.Advance(10 * time.Minute)
	ext, err := e.c.Extend(ctx, sb.ID, 2*time.Hour)
	if err != nil || !ext.ExpiresAt.Equal(e.clock.Now().Add(2*time.Hour)) {
		t.Fatalf("extend: %+v %v", ext, err)
	}

	// delete twice; nothing of ours is left
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if ids := e.px.VMIDs(); len(ids) != 0 {
		t.Errorf("VMs left: %v", ids)
	}
	if z, v, s := e.px.SDNObjects(); z+v+s != 0 {
		t.Errorf("sdn objects left %d/%d/%d", z, v, s)
	}
	if _, err := e.c.Get(ctx, sb.ID); !client.IsProblem(err, apitype.ProblemNotFound) {
		t.Errorf("get after delete: %v", err)
	}
	if got := e.metric("pve_inspect_sandboxes", "state", "ready"); got != 0 {
		t.Errorf("ready gauge %v", got)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	for _, op := range []string{"CreateZone", "CreateSubnet", "ApplySDN", "CloneVM", "ConfigureVM", "ResizeDisk", "StartVM", "agent"} {
		t.Run(op, func(t *testing.T) {
			e := newEnv(t, func(o *options) { o.AgentTimeout = 300 * time.Millisecond })
			if op == "agent" {
				for id := 100; id < 110; id++ {
					e.guests.PingFails[id] = true
				}
			} else {
				e.px.FailOnce(op, fmt.Errorf("injected %s failure", op))
			}
			_, err := e.c.Create(e.ctx(), twoVMs())
			want := apitype.ProblemProxmox
			if op == "agent" {
				want = apitype.ProblemGuestUnavailable
			}
			if !client.IsProblem(err, want) {
				t.Fatalf("create err = %v, want %s", err, want)
			}
			if ids := e.px.VMIDs(); len(ids) != 0 {
				t.Errorf("VMs left: %v", ids)
			}
			if z, v, s := e.px.SDNObjects(); z+v+s != 0 {
				t.Errorf("sdn objects left %d/%d/%d", z, v, s)
			}
			if l, _ := e.c.List(e.ctx()); len(l) != 0 {
				t.Errorf("sandboxes left: %+v", l)
			}
		})
	}
}

func TestGuardRefusesOverCaps(t *testing.T) {
	caps := sandbox.Caps{SandboxVCPUs: 4, SandboxMemoryMiB: 4096, SandboxVMs: 3, NodeVCPUs: 6, NodeMemoryMiB: 6144, NodeVMs: 4, NodeSandboxes: 2}
	vm := func(cores, mem int) apitype.VMRequest {
		return apitype.VMRequest{Template: "debian", Cores: cores, MemoryMiB: mem}
	}
	tests := []struct {
		name     string
		existing []apitype.CreateRequest
		req      apitype.CreateRequest
		cap      string
	}{
		{"sandbox vms", nil, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(1, 512), vm(1, 512), vm(1, 512), vm(1, 512)}}, "sandbox_vms"},
		{"sandbox vcpus", nil, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(3, 512), vm(2, 512)}}, "sandbox_vcpus"},
		{"sandbox memory", nil, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(1, 4097)}}, "sandbox_memory_mib"},
		{"node sandboxes", []apitype.CreateRequest{{VMs: []apitype.VMRequest{vm(1, 512)}}, {VMs: []apitype.VMRequest{vm(1, 512)}}}, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(1, 512)}}, "node_sandboxes"},
		{"node vms", []apitype.CreateRequest{{VMs: []apitype.VMRequest{vm(1, 512), vm(1, 512), vm(1, 512)}}}, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(1, 512), vm(1, 512)}}, "node_vms"},
		{"node vcpus", []apitype.CreateRequest{{VMs: []apitype.VMRequest{vm(4, 512)}}}, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(3, 512)}}, "node_vcpus"},
		{"node memory", []apitype.CreateRequest{{VMs: []apitype.VMRequest{vm(1, 4096)}}}, apitype.CreateRequest{VMs: []apitype.VMRequest{vm(1, 2049)}}, "node_memory_mib"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *options) { o.Caps = caps })
			for _, r := range tc.existing {
				e.create(r)
			}
			before := e.px.Mutations()
			vmsBefore := e.px.VMIDs()
			_, err := e.c.Create(e.ctx(), tc.req)
			p, ok := err.(*apitype.Problem)
			if !ok || p.Type != apitype.ProblemGuardRefused || p.Cap != tc.cap || p.Status != http.StatusTooManyRequests || !strings.Contains(p.Detail, tc.cap) {
				t.Fatalf("err = %#v, want guard-refused naming %s", err, tc.cap)
			}
			if e.px.Mutations() != before || !slices.Equal(e.px.VMIDs(), vmsBefore) {
				t.Errorf("refused create changed Proxmox: %d -> %d mutations", before, e.px.Mutations())
			}
			if got := e.metric("pve_inspect_guard_refusals_total", "cap", tc.cap); got != 1 {
				t.Errorf("guard refusals{cap=%s} = %v", tc.cap, got)
			}
		})
	}
}

func TestConcurrentCreates(t *testing.T) {
	e := newEnv(t, nil)
	const n = 8
	var wg sync.WaitGroup
	sbs := make([]apitype.Sandbox, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian"}}})
			if errs[i] != nil {
				return
			}
			for k := 0; k < 20; k++ {
				res, err := e.c.Exec(e.ctx(), sbs[i].ID, "vm1", apitype.ExecRequest{Argv: []string{"echo", sbs[i].ID, fmt.Sprint(k)}})
				if err != nil || string(res.Stdout) != fmt.Sprintf("%s %d\n", sbs[i].ID, k) {
					errs[i] = fmt.Errorf("exec %d: %+v %v", k, res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	cidrs := map[string]bool{}
	vmids := map[int]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("sandbox %d: %v", i, errs[i])
		}
		p := netip.MustParsePrefix(sbs[i].Networks[0].CIDR)
		for c := range cidrs {
			if netip.MustParsePrefix(c).Overlaps(p) {
				t.Errorf("CIDR %s overlaps %s", p, c)
			}
		}
		cidrs[p.String()] = true
		for _, v := range sbs[i].VMs {
			if vmids[v.VMID] {
				t.Errorf("vmid %d used twice", v.VMID)
			}
			vmids[v.VMID] = true
		}
	}
	if len(e.px.VMIDs()) != 2*n {
		t.Errorf("%d VMs, want %d", len(e.px.VMIDs()), 2*n)
	}
}

func TestExplicitCIDRConflict(t *testing.T) {
	e := newEnv(t, nil)
	e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.50.0/24"}}})
	before := e.px.Mutations()
	_, err := e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.50.0/25"}}})
	if !client.IsProblem(err, apitype.ProblemConflict) || e.px.Mutations() != before {
		t.Fatalf("overlapping CIDR: %v (mutations %d -> %d)", err, before, e.px.Mutations())
	}
	// The refusal says it ends when the range is free, and which network.
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Reason != apitype.ReasonCIDRInUse || p.Field != "networks[0].cidr" {
		t.Errorf("overlapping CIDR: %+v, want reason %s and field networks[0].cidr", p, apitype.ReasonCIDRInUse)
	}
	// Two networks of one request that overlap: a conflict no wait ends.
	_, err = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Networks: []apitype.NetworkRequest{
		{Name: "a", CIDR: "192.168.60.0/24"}, {Name: "b", CIDR: "192.168.60.0/25"}}})
	if !errors.As(err, &p) || p.Type != apitype.ProblemConflict || p.Reason != "" || !strings.Contains(p.Detail, `overlaps network "a" of the same sandbox`) {
		t.Errorf("overlapping networks of one sandbox: %v, want a conflict without a reason", err)
	}
	// A foreign subnet in Proxmox is avoided by auto: one over the range
	// the node's search starts at (what auto picks on an empty cluster),
	// and the range before it.
	first := netip.MustParsePrefix(newEnv(t, nil).create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}).Networks[0].CIDR)
	foreign := netip.PrefixFrom(first.Addr(), 23).Masked()
	e2 := newEnv(t, nil)
	e2.px.AddVNet(sandbox.VNetInfo{ID: "other", Zone: "otherz"}, foreign.String())
	sb := e2.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if got := netip.MustParsePrefix(sb.Networks[0].CIDR); got.Overlaps(foreign) {
		t.Errorf("auto picked %s in a foreign %s", got, foreign)
	}
}

func TestTTLReaper(t *testing.T) {
	e := newEnv(t, func(o *options) { o.ReaperInterval = 20 * time.Millisecond })
	short := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, TTLSeconds: 5})
	long := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, TTLSeconds: 3600})
	if n := e.srv.Engine().Reap(e.ctx()); n != 0 {
		t.Fatalf("reaped %d before expiry", n)
	}
	e.clock.Advance(6 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.srv.Engine().RunReaper(ctx); close(done) }()
	stopped := false
	stop := func() {
		if !stopped {
			cancel()
			<-done
			stopped = true
		}
	}
	defer stop()
	deadline := time.After(10 * time.Second)
	for {
		if _, err := e.c.Get(e.ctx(), short.ID); client.IsProblem(err, apitype.ProblemNotFound) {
			break
		}
		select {
		case <-deadline:
			t.Fatal("expired sandbox not reaped")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if _, err := e.c.Get(e.ctx(), long.ID); err != nil {
		t.Errorf("unexpired sandbox: %v", err)
	}
	if ids := e.px.VMIDs(); len(ids) != 1 || ids[0] != long.VMs[0].VMID {
		t.Errorf("VMs left %v", ids)
	}
	if got := e.metric("pve_inspect_reaper_deletions_total"); got != 1 {
		t.Errorf("reaper deletions %v", got)
	}
}

func TestRestartReconcile(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(twoVMs())
	// Objects a restarted daemon finds: an orphan of ours (both tags,
	// unknown sandbox), a VM without tags, a VM of another node, a VM with
	// only our node tag, and an orphan vnet/zone of ours.
	e.px.AddVM(sandbox.VMInfo{VMID: 500, Name: "orphan", Status: "running", Tags: []string{"pvei-n-node1", "pvei-s-sbzzzzzz"}})
	e.px.AddVM(sandbox.VMInfo{VMID: 501, Name: "untagged", Status: "running"})
	e.px.AddVM(sandbox.VMInfo{VMID: 502, Name: "othernode", Status: "running", Tags: []string{"pvei-n-node2", "pvei-s-sbyyyyyy"}})
	e.px.AddVM(sandbox.VMInfo{VMID: 503, Name: "halftagged", Status: "running", Tags: []string{"pvei-n-node1"}})
	e.px.AddVNet(sandbox.VNetInfo{ID: "vzzzzzz0", Zone: "sbzzzzzz", Alias: "pvei-n-node1 pvei-s-sbzzzzzz"}, "10.99.0.0/24")
	e.px.AddVNet(sandbox.VNetInfo{ID: "foreign", Zone: "fzone", Alias: "somebody"}, "10.98.0.0/24")

	// "restart": a new server on the same state dir and Proxmox.
	e2 := newEnvOn(t, e.px, e.guests, e.opts.StateDir, nil)
	got, err := e2.c.Get(e2.ctx(), sb.ID)
	if err != nil || got.State != apitype.StateReady {
		t.Fatalf("sandbox after restart: %+v %v", got, err)
	}
	res, err := e2.c.Exec(e2.ctx(), sb.ID, "b", apitype.ExecRequest{Argv: []string{"echo", "still"}})
	if err != nil || string(res.Stdout) != "still\n" {
		t.Fatalf("exec after restart: %+v %v", res, err)
	}
	want := []int{sb.VMs[0].VMID, sb.VMs[1].VMID, 501, 502, 503}
	slices.Sort(want)
	if ids := e.px.VMIDs(); !slices.Equal(ids, want) {
		t.Errorf("VMs after reconcile %v, want %v (orphan 500 deleted, nothing else touched)", ids, want)
	}
	if _, ok := e.px.VNets["vzzzzzz0"]; ok {
		t.Error("orphan vnet not deleted")
	}
	if e.px.Zones["sbzzzzzz"] {
		t.Error("orphan zone not deleted")
	}
	if _, ok := e.px.VNets["foreign"]; !ok || !e.px.Zones["fzone"] {
		t.Error("foreign vnet/zone touched")
	}
	if err := e2.c.Delete(e2.ctx(), sb.ID); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileFinishesInterruptedCreate(t *testing.T) {
	e := newEnv(t, func(o *options) { o.AgentTimeout = 200 * time.Millisecond })
	// A create that fails teardown too leaves state "error"; simulate the
	// daemon dying mid-create instead: make teardown fail, then restart
	// with Proxmox healthy.
	e.px.Fail("StartVM", fmt.Errorf("injected"))
	e.px.Fail("DeleteVM", fmt.Errorf("injected delete"))
	if _, err := e.c.Create(e.ctx(), twoVMs()); err == nil {
		t.Fatal("create succeeded")
	}
	if len(e.px.VMIDs()) == 0 {
		t.Fatal("expected leftovers while Proxmox refuses deletes")
	}
	e.px.Fail("StartVM", nil)
	e.px.Fail("DeleteVM", nil)
	l, _ := e.c.List(e.ctx())
	if len(l) != 1 || l[0].State != apitype.StateError {
		t.Fatalf("failed sandbox should stay listed in state error: %+v", l)
	}
	// A DELETE of the errored sandbox now cleans it up.
	if err := e.c.Delete(e.ctx(), l[0].ID); err != nil {
		t.Fatal(err)
	}
	if ids := e.px.VMIDs(); len(ids) != 0 {
		t.Errorf("VMs left: %v", ids)
	}
	if z, v, s := e.px.SDNObjects(); z+v+s != 0 {
		t.Errorf("sdn left %d/%d/%d", z, v, s)
	}
}

func TestAuthMatrix(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	execBody := `{"argv":["echo","hi"]}`
	tests := []struct {
		name, token, method, path, body string
		want                            int
		typ                             string
	}{
		{"no token", "", "GET", "/v1/sandboxes", "", 401, apitype.ProblemUnauthorized},
		{"wrong token", "nope", "GET", "/v1/sandboxes", "", 401, apitype.ProblemUnauthorized},
		{"not bearer", "Basic cjpy", "GET", "/v1/sandboxes", "", 401, apitype.ProblemUnauthorized},
		{"read lists", "r", "GET", "/v1/sandboxes", "", 200, ""},
		{"read cannot exec", "r", "POST", "/v1/sandboxes/" + sb.ID + "/vms/vm0/exec", execBody, 403, apitype.ProblemForbidden},
		{"exec execs", "x", "POST", "/v1/sandboxes/" + sb.ID + "/vms/vm0/exec", execBody, 200, ""},
		{"exec cannot create", "x", "POST", "/v1/sandboxes", `{"vms":[{"template":"debian"}]}`, 403, apitype.ProblemForbidden},
		{"exec cannot delete", "x", "DELETE", "/v1/sandboxes/" + sb.ID, "", 403, apitype.ProblemForbidden},
		{"read cannot read files", "r", "GET", "/v1/sandboxes/" + sb.ID + "/vms/vm0/files?path=/x", "", 403, apitype.ProblemForbidden},
		{"admin execs", "a", "POST", "/v1/sandboxes/" + sb.ID + "/vms/vm0/exec", execBody, 200, ""},
		{"no token healthz", "", "GET", "/v1/healthz", "", 401, apitype.ProblemUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, e.tcp.URL+tc.path, strings.NewReader(tc.body))
			switch {
			case strings.HasPrefix(tc.token, "Basic"):
				req.Header.Set("Authorization", tc.token)
			case tc.token != "":
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.want {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, b)
			}
			if tc.typ != "" {
				p := decodeProblemResp(t, resp)
				if p.Type != tc.typ {
					t.Errorf("type %q, want %q", p.Type, tc.typ)
				}
			}
		})
	}
	if l, _ := e.c.List(e.ctx()); len(l) != 1 {
		t.Errorf("refused calls changed the sandboxes: %d", len(l))
	}
	// The client with a token works over the TCP handler.
	c := client.New(e.tcp.URL, client.WithToken("x"))
	if _, err := c.Exec(e.ctx(), sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo"}}); err != nil {
		t.Errorf("client with exec token: %v", err)
	}
	if err := c.Delete(e.ctx(), sb.ID); !client.IsProblem(err, apitype.ProblemForbidden) {
		t.Errorf("client delete with exec token: %v", err)
	}
}

func decodeProblemResp(t *testing.T, resp *http.Response) apitype.Problem {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("content type %q", ct)
	}
	var p apitype.Problem
	dec := json.NewDecoder(resp.Body)
	if err := dec.Decode(&p); err != nil {
		t.Fatal(err)
	}
	if p.Status != resp.StatusCode || p.Title == "" || !slices.Contains(apitype.ProblemTypes(), p.Type) {
		t.Fatalf("problem %+v with status %d", p, resp.StatusCode)
	}
	return p
}

func TestProblemDocuments(t *testing.T) {
	e := newEnv(t, func(o *options) { o.MaxFileBytes = 1 << 20 })
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err := e.c.WriteFile(e.ctx(), sb.ID, "vm0", "/big", bytes.NewReader(make([]byte, 1<<20)), 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	e.guests.Dial(fmt.Sprintf("/x/%d.qga", sb.VMs[0].VMID)).WriteFile(e.ctx(), "/bigger", bytes.NewReader(make([]byte, 1<<20+1)), 0o644)
	vm := "/v1/sandboxes/" + sb.ID + "/vms/vm0"
	tests := []struct {
		name, method, path, ctype, body string
		status                          int
		typ                             string
	}{
		{"bad json", "POST", "/v1/sandboxes", "application/json", `{"vms":`, 400, apitype.ProblemInvalidRequest},
		{"unknown field", "POST", "/v1/sandboxes", "application/json", `{"vms":[{"template":"debian"}],"root":true}`, 400, apitype.ProblemInvalidRequest},
		{"trailing data", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian"}]} {}`, 400, apitype.ProblemInvalidRequest},
		// schemathesis ST201: a JSON null body was taken as the empty request.
		{"null body", "POST", "/v1/sandboxes/" + sb.ID + "/check", "application/json", `null`, 400, apitype.ProblemInvalidRequest},
		{"null egress policy", "PUT", "/v1/sandboxes/" + sb.ID + "/egress", "application/json", ` null`, 400, apitype.ProblemInvalidRequest},
		{"array body", "POST", "/v1/sandboxes", "application/json", `[{"vms":[{"template":"debian"}]}]`, 400, apitype.ProblemInvalidRequest},
		{"wrong content type", "POST", "/v1/sandboxes", "text/plain", `{}`, 415, apitype.ProblemUnsupportedMediaType},
		{"oversize", "POST", "/v1/sandboxes", "application/json", `{"labels":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, 413, apitype.ProblemPayloadTooLarge},
		{"no vms", "POST", "/v1/sandboxes", "", `{"vms":[]}`, 400, apitype.ProblemInvalidRequest},
		{"absurd cores", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian","cores":100000000}]}`, 400, apitype.ProblemInvalidRequest},
		{"absurd memory", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian","memory_mib":99999999999}]}`, 400, apitype.ProblemInvalidRequest},
		{"int overflow", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian","cores":1e99}]}`, 400, apitype.ProblemInvalidRequest},
		{"negative ttl", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian"}],"ttl_seconds":-1}`, 400, apitype.ProblemInvalidRequest},
		{"bad cidr", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian"}],"networks":[{"name":"n","cidr":"8.8.8.0/24"}]}`, 400, apitype.ProblemInvalidRequest},
		{"unknown template", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"windows"}]}`, 400, apitype.ProblemInvalidRequest},
		{"unknown network", "POST", "/v1/sandboxes", "", `{"vms":[{"template":"debian","networks":["x"]}]}`, 400, apitype.ProblemInvalidRequest},
		{"unknown sandbox", "GET", "/v1/sandboxes/sbaaaaaa", "", "", 404, apitype.ProblemNotFound},
		{"bad sandbox id", "GET", "/v1/sandboxes/..%2f", "", "", 404, apitype.ProblemNotFound},
		{"unknown vm", "POST", "/v1/sandboxes/" + sb.ID + "/vms/zz/exec", "", `{"argv":["true"]}`, 404, apitype.ProblemNotFound},
		{"no route", "GET", "/v2/x", "", "", 404, apitype.ProblemNotFound},
		{"wrong method", "PATCH", "/v1/sandboxes", "", "", 405, apitype.ProblemMethodNotAllowed},
		{"empty argv", "POST", vm + "/exec", "", `{"argv":[]}`, 400, apitype.ProblemInvalidRequest},
		{"nul in argv", "POST", vm + "/exec", "", `{"argv":["a\u0000b"]}`, 400, apitype.ProblemInvalidRequest},
		// schemathesis ST202: the guest agent client takes identifiers only
		{"env name not an identifier", "POST", vm + "/exec", "", `{"argv":["true"],"env":{"(x)":"1"}}`, 400, apitype.ProblemInvalidRequest},
		{"absurd timeout", "POST", vm + "/exec", "", `{"argv":["true"],"timeout_seconds":999999999}`, 400, apitype.ProblemInvalidRequest},
		{"nul in path", "GET", vm + "/files?path=/etc/pa%00sswd", "", "", 400, apitype.ProblemInvalidRequest},
		{"relative path", "GET", vm + "/files?path=etc/passwd", "", "", 400, apitype.ProblemInvalidRequest},
		{"missing path", "GET", vm + "/files", "", "", 400, apitype.ProblemInvalidRequest},
		{"file not found", "GET", vm + "/files?path=/nope", "", "", 404, apitype.ProblemFileNotFound},
		{"is a directory", "GET", vm + "/files?path=/etc/", "", "", 409, apitype.ProblemIsDirectory},
		{"permission", "PUT", vm + "/files?path=/proc/x", "", "x", 403, apitype.ProblemPermissionDenied},
		{"read over cap", "GET", vm + "/files?path=/bigger", "", "", 413, apitype.ProblemOutputLimit},
		{"write over cap", "PUT", vm + "/files?path=/huge", "", strings.Repeat("x", 1<<20+1), 413, apitype.ProblemPayloadTooLarge},
		{"bad mode", "PUT", vm + "/files?path=/m&mode=99", "", "x", 400, apitype.ProblemInvalidRequest},
		{"bad snapshot name", "POST", vm + "/snapshots", "", `{"name":"1;rm"}`, 400, apitype.ProblemInvalidRequest},
		{"rollback unknown", "POST", vm + "/snapshots/nosuch/rollback", "", "", 404, apitype.ProblemNotFound},
		{"extend too long", "POST", "/v1/sandboxes/" + sb.ID + "/extend", "", `{"ttl_seconds":99999999}`, 400, apitype.ProblemInvalidRequest},
		{"guest timeout", "POST", vm + "/exec", "", `{"argv":["hang"]}`, 504, apitype.ProblemGuestTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.px.Mutations()
			resp := e.raw(tc.method, tc.path, tc.ctype, strings.NewReader(tc.body))
			if resp.StatusCode != tc.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if p := decodeProblemResp(t, resp); p.Type != tc.typ {
				t.Errorf("type %q, want %q (%s)", p.Type, tc.typ, p.Detail)
			}
			if tc.name != "rollback unknown" && e.px.Mutations() != before {
				t.Errorf("Proxmox changed: %d -> %d", before, e.px.Mutations())
			}
		})
	}
	var b bytes.Buffer
	if _, err := e.c.ReadFile(e.ctx(), sb.ID, "vm0", "/big", &b); err != nil || b.Len() != 1<<20 {
		t.Errorf("read at the cap: %d %v", b.Len(), err)
	}
	if _, err := e.c.ReadFile(e.ctx(), sb.ID, "vm0", "/huge", &b); !client.IsProblem(err, apitype.ProblemFileNotFound) {
		t.Errorf("refused upload left a file: %v", err)
	}
	if l, _ := e.c.List(e.ctx()); len(l) != 1 {
		t.Errorf("sandboxes: %d", len(l))
	}
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	e := newEnv(t, nil)
	doc, err := e.c.OpenAPI(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if doc["openapi"] != "3.0.3" {
		t.Fatalf("openapi version %v", doc["openapi"])
	}
	paths := doc["paths"].(map[string]any)
	documented := map[string]bool{}
	for p, item := range paths {
		for m := range item.(map[string]any) {
			documented[strings.ToUpper(m)+" "+p] = true
		}
	}
	served := e.srv.Routes()
	if len(served) != len(documented) {
		t.Errorf("%d routes served, %d documented", len(served), len(documented))
	}
	fill := strings.NewReplacer("{id}", "sbabcdef", "{vm}", "vm0", "{name}", "snap1")
	for _, r := range served {
		if !documented[r] {
			t.Errorf("served route %q is not documented", r)
		}
	}
	for r := range documented {
		if !slices.Contains(served, r) {
			t.Errorf("documented route %q is not served", r)
		}
		// The documented route really reaches a handler (not the
		// catch-all): an unauthenticated call through Handler gets 401.
		method, path, _ := strings.Cut(r, " ")
		req, _ := http.NewRequest(method, e.tcp.URL+fill.Replace(path), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s: status %d, want 401 from the route's handler", method, path, resp.StatusCode)
		}
	}
	// Every schema reference resolves.
	schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
	b, _ := json.Marshal(doc)
	for _, part := range strings.Split(string(b), `"$ref":"#/components/schemas/`)[1:] {
		name := part[:strings.IndexByte(part, '"')]
		if _, ok := schemas[name]; !ok {
			t.Errorf("dangling schema reference %q", name)
		}
	}
}

func TestMetricsRequests(t *testing.T) {
	e := newEnv(t, nil)
	_, _ = e.c.Get(e.ctx(), "sbnope00")
	_, _ = e.c.List(e.ctx())
	if got := e.metric("pve_inspect_api_requests_total", "route", "GET /v1/sandboxes/{id}", "code", "404"); got != 1 {
		t.Errorf("requests{get sandbox,404} = %v", got)
	}
	if got := e.metric("pve_inspect_api_requests_total", "route", "GET /v1/sandboxes", "code", "200"); got != 1 {
		t.Errorf("requests{list,200} = %v", got)
	}
	if n := e.series("pve_inspect_api_request_duration_seconds"); n != 2 {
		t.Errorf("latency series %d, want 2", n)
	}
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if got := e.metric("pve_inspect_sandboxes", "state", "ready"); got != 1 {
		t.Errorf("sandboxes{ready} = %v", got)
	}
	if got := e.metric("pve_inspect_sandbox_vms", "state", "ready"); got != 1 {
		t.Errorf("sandbox_vms{ready} = %v", got)
	}
	e.guests.PingFails[sb.VMs[0].VMID] = true
	_, err := e.c.Exec(e.ctx(), sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo"}})
	if !client.IsProblem(err, apitype.ProblemGuestUnavailable) {
		t.Fatalf("exec on dead agent: %v", err)
	}
	if got := e.metric("pve_inspect_guest_agent_errors_total", "kind", apitype.ProblemGuestUnavailable); got != 1 {
		t.Errorf("guest errors = %v", got)
	}
	// streamed exec on a dead agent: error record, counted too
	_, err = e.c.ExecStream(e.ctx(), sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo"}}, io.Discard, io.Discard)
	if !client.IsProblem(err, apitype.ProblemGuestUnavailable) {
		t.Fatalf("stream on dead agent: %v", err)
	}
	if got := e.metric("pve_inspect_guest_agent_errors_total", "kind", apitype.ProblemGuestUnavailable); got != 2 {
		t.Errorf("guest errors = %v", got)
	}
}

// TestReconcileCarriesOn: an orphan that will not go away (a VM under a
// backup lock, a failed SDN apply) is reported and logged; the reconcile
// still succeeds and cleans up the rest. Only a Proxmox it cannot list
// fails it.
func TestReconcileCarriesOn(t *testing.T) {
	cases := map[string]struct {
		fail       string
		wantFailed []string
		wantErr    bool
	}{
		"vm locked":       {fail: "DeleteVM", wantFailed: []string{"orphan vm 500", "orphan vm 504", "orphan zone sbzzzzzz"}},
		"sdn apply fails": {fail: "ApplySDN", wantFailed: []string{"orphan zone sbzzzzzz"}},
		"cannot list vms": {fail: "ListVMs", wantErr: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.px.AddVM(sandbox.VMInfo{VMID: 500, Name: "orphan", Status: "running", Tags: []string{"pvei-n-node1", "pvei-s-sbzzzzzz"}})
			e.px.AddVM(sandbox.VMInfo{VMID: 504, Name: "orphan2", Status: "stopped", Tags: []string{"pvei-n-node1", "pvei-s-sbxxxxxx"}})
			e.px.AddVNet(sandbox.VNetInfo{ID: "vzzzzzz0", Zone: "sbzzzzzz", Alias: "pvei-n-node1 pvei-s-sbzzzzzz"}, "10.99.0.0/24")
			e.px.Fail(c.fail, errors.New("injected: "+c.fail))
			rep, err := e.srv.Engine().Reconcile(e.ctx())
			if c.wantErr {
				if err == nil {
					t.Fatalf("reconcile succeeded without the VM list: %+v", rep)
				}
				return
			}
			if err != nil {
				t.Fatalf("reconcile failed on one object: %v", err)
			}
			slices.Sort(rep.Failed)
			if !slices.Equal(rep.Failed, c.wantFailed) {
				t.Errorf("failed %q, want %q", rep.Failed, c.wantFailed)
			}
			if c.fail == "DeleteVM" {
				if ids := e.px.VMIDs(); !slices.Equal(ids, []int{500, 504}) {
					t.Errorf("VMs left %v, want the locked 500 and 504", ids)
				}
				if !e.px.Zones["sbzzzzzz"] {
					t.Error("zone of a VM that stayed deleted")
				}
			}
		})
	}
}

// TestOpenAPITTLBounds: the document says the TTL bounds extend and create
// enforce (schemathesis ST202: a ttl_seconds the schema allowed was
// refused), and they are exact: the maximum is accepted, one more refused.
func TestOpenAPITTLBounds(t *testing.T) {
	e := newEnv(t, nil)
	doc, err := e.c.OpenAPI(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	props := func(schema string) map[string]any {
		return doc["components"].(map[string]any)["schemas"].(map[string]any)[schema].(map[string]any)["properties"].(map[string]any)
	}
	ext := props("ExtendRequest")["ttl_seconds"].(map[string]any)
	cr := props("CreateRequest")["ttl_seconds"].(map[string]any)
	maxTTL, ok := ext["maximum"].(float64)
	if !ok || ext["minimum"] != float64(1) || cr["maximum"] != maxTTL || cr["minimum"] != float64(0) {
		t.Fatalf("extend ttl %v, create ttl %v: want documented bounds", ext, cr)
	}
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	for _, tc := range []struct {
		ttl    int64
		status int
	}{{int64(maxTTL), 200}, {int64(maxTTL) + 1, 400}, {1, 200}, {0, 400}} {
		resp := e.raw("POST", "/v1/sandboxes/"+sb.ID+"/extend", "application/json", strings.NewReader(fmt.Sprintf(`{"ttl_seconds":%d}`, tc.ttl)))
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("extend ttl %d: status %d, want %d", tc.ttl, resp.StatusCode, tc.status)
		}
	}
}
