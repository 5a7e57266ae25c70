package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// fakeSandboxes is a sandbox API with one VM's files in memory. Its
// fields inject the canary's faults.
type fakeSandboxes struct {
	files, snap  map[string][]byte
	created      bool
	deleted      bool
	failCreate   error
	noRollback   bool // the rollback leaves the files as they are
	checkFails   bool
	corruptLarge bool // files of 1 MiB and more come back changed
	stillListed  bool // the deleted sandbox is still listed
	// requests are the creates asked for; wrongKind answers a container
	// request with a VM
	requests  []apitype.CreateRequest
	wrongKind bool
}

func newFakeSandboxes() *fakeSandboxes {
	return &fakeSandboxes{files: map[string][]byte{}}
}

var fakeSB = apitype.Sandbox{ID: "sbtest01", State: "running", Zone: "sbtest01", VMs: []apitype.VM{{Name: "vm0", VMID: 100}}}

func (f *fakeSandboxes) Create(_ context.Context, r apitype.CreateRequest) (apitype.Sandbox, error) {
	f.requests = append(f.requests, r)
	if f.failCreate != nil {
		return apitype.Sandbox{}, f.failCreate
	}
	f.created = true
	sb := fakeSB
	if len(r.VMs) == 1 && r.VMs[0].Kind == apitype.KindLXC && !f.wrongKind {
		sb.VMs = []apitype.VM{{Name: "vm0", VMID: 100, Kind: apitype.KindLXC}}
	}
	return sb, nil
}

func (f *fakeSandboxes) List(context.Context) ([]apitype.Sandbox, error) {
	if f.created && (!f.deleted || f.stillListed) {
		return []apitype.Sandbox{fakeSB}, nil
	}
	return nil, nil
}

func (f *fakeSandboxes) Exec(_ context.Context, _, _ string, r apitype.ExecRequest) (*apitype.ExecResult, error) {
	switch {
	case len(r.Argv) == 2 && r.Argv[0] == "uname":
		return &apitype.ExecResult{Stdout: []byte("Linux\n")}, nil
	case len(r.Argv) == 2 && r.Argv[0] == "cat":
		return &apitype.ExecResult{Stdout: f.files[r.Argv[1]]}, nil
	}
	return nil, fmt.Errorf("fake: exec %v", r.Argv)
}

func (f *fakeSandboxes) WriteFile(_ context.Context, _, _, path string, r io.Reader, _ int64, _ uint32) error {
	b, err := io.ReadAll(r)
	f.files[path] = b
	return err
}

func (f *fakeSandboxes) ReadFile(_ context.Context, _, _, path string, w io.Writer) (int64, error) {
	b := bytes.Clone(f.files[path])
	if f.corruptLarge && len(b) >= 1<<20 {
		b[0] ^= 1
	}
	n, err := w.Write(b)
	return int64(n), err
}

func (f *fakeSandboxes) Snapshot(context.Context, string, string, string) error {
	f.snap = maps.Clone(f.files)
	return nil
}

func (f *fakeSandboxes) Rollback(context.Context, string, string, string) error {
	if !f.noRollback {
		f.files = maps.Clone(f.snap)
	}
	return nil
}

func (f *fakeSandboxes) Check(context.Context, string, string) (apitype.CheckReport, error) {
	row := apitype.CheckRow{Target: "node management", Probe: "tcp 8006", Expected: "blocked", Observed: "blocked", Pass: true}
	if f.checkFails {
		row.Observed, row.Pass = "open", false
	}
	return apitype.CheckReport{Sandbox: fakeSB.ID, VM: "vm0", Pass: row.Pass, Rows: []apitype.CheckRow{row}}, nil
}

func (f *fakeSandboxes) Delete(context.Context, string) error {
	f.deleted = true
	return nil
}

// fakeAPI answers GETs from a map of path -> value.
type fakeAPI map[string]any

func (f fakeAPI) Get(_ context.Context, path string, v any) error {
	x, ok := f[path]
	if !ok {
		return fmt.Errorf("fake: no %s", path)
	}
	b, err := json.Marshal(x)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func TestCanary(t *testing.T) {
	clean := func() fakeAPI {
		return fakeAPI{"/nodes/pve/qemu": []map[string]any{{"vmid": 9000}}, "/cluster/sdn/zones?pending=1": []map[string]any{},
			"/nodes/pve/storage/local/content?vmid=100": []map[string]any{}}
	}
	steps := []string{"canary: create", "canary: exec", "canary: file, streaming path", "canary: file, disk path",
		"canary: snapshot and rollback", "canary: containment check", "canary: delete", "canary: nothing left behind"}
	for _, tc := range []struct {
		name    string
		fault   func(*fakeSandboxes, fakeAPI)
		disk    int64
		want    map[string]Status // the steps not named pass
		detail  string            // in the first failure's detail
		deleted bool
	}{
		{name: "all pass", disk: 2 << 20, deleted: true},
		{name: "disk path off", want: map[string]Status{"canary: file, disk path": Skip}, deleted: true},
		{name: "create fails", fault: func(f *fakeSandboxes, _ fakeAPI) {
			f.failCreate = errors.New("403 Permission check failed (/vms/100, VM.Config.HWType)")
		},
			want: map[string]Status{"canary: create": Fail, "canary: exec": Skip, "canary: file, streaming path": Skip, "canary: file, disk path": Skip,
				"canary: snapshot and rollback": Skip, "canary: containment check": Skip, "canary: delete": Skip, "canary: nothing left behind": Skip},
			detail: "VM.Config.HWType"},
		{name: "disk path corrupts", disk: 2 << 20, fault: func(f *fakeSandboxes, _ fakeAPI) { f.corruptLarge = true },
			want: map[string]Status{"canary: file, disk path": Fail}, detail: "content differs", deleted: true},
		{name: "rollback restores nothing", disk: 1 << 20, fault: func(f *fakeSandboxes, _ fakeAPI) { f.noRollback = true },
			want: map[string]Status{"canary: snapshot and rollback": Fail}, detail: `"after\n"`, deleted: true},
		{name: "containment fails", disk: 1 << 20, fault: func(f *fakeSandboxes, _ fakeAPI) { f.checkFails = true },
			want: map[string]Status{"canary: containment check": Fail}, detail: "node management tcp 8006: want blocked, saw open", deleted: true},
		{name: "VM and zone left on Proxmox", disk: 1 << 20, fault: func(_ *fakeSandboxes, px fakeAPI) {
			px["/nodes/pve/qemu"] = []map[string]any{{"vmid": 9000}, {"vmid": 100}}
			px["/cluster/sdn/zones?pending=1"] = []map[string]any{{"zone": "sbtest01", "state": "deleted"}}
		}, want: map[string]Status{"canary: nothing left behind": Fail}, detail: "left behind: VM 100, SDN zone sbtest01", deleted: true},
		{name: "transfer image left", disk: 1 << 20, fault: func(_ *fakeSandboxes, px fakeAPI) {
			px["/nodes/pve/storage/local/content?vmid=100"] = []map[string]any{{"volid": "local:100/vm-100-disk-1.raw"}}
		}, want: map[string]Status{"canary: nothing left behind": Fail}, detail: "volume local:100/vm-100-disk-1.raw", deleted: true},
		{name: "still listed", disk: 1 << 20, fault: func(f *fakeSandboxes, _ fakeAPI) { f.stillListed = true },
			want: map[string]Status{"canary: nothing left behind": Fail}, detail: "sandbox sbtest01 still listed", deleted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, px := newFakeSandboxes(), clean()
			if tc.fault != nil {
				tc.fault(f, px)
			}
			rep := Canary(context.Background(), f, px, Node{Name: "pve", TransferStorage: "local"}, CanaryOptions{Template: "debian", DiskBytes: tc.disk})
			if len(rep.Checks) != len(steps) {
				t.Fatalf("%d steps: %+v", len(rep.Checks), rep.Checks)
			}
			failed := false
			for i, c := range rep.Checks {
				want := Pass
				if w, ok := tc.want[c.Name]; ok {
					want = w
				}
				if c.Name != steps[i] || c.Status != want {
					t.Errorf("step %d: %s %s (%s), want %s %s", i, c.Name, c.Status, c.Detail, steps[i], want)
				}
				if c.Status == Fail {
					failed = true
					if c.Fix == "" {
						t.Errorf("%s failed without a fix", c.Name)
					}
				}
			}
			if rep.Pass == failed {
				t.Errorf("report pass %v, a step failed %v", rep.Pass, failed)
			}
			if fl := rep.Failed(); tc.detail != "" && (len(fl) == 0 || !strings.Contains(fl[0].Detail, tc.detail)) {
				t.Errorf("first failure %+v does not name %q", fl, tc.detail)
			}
			if f.deleted != tc.deleted {
				t.Errorf("deleted %v, want %v", f.deleted, tc.deleted)
			}
		})
	}
}

func TestReportText(t *testing.T) {
	rep := Run(context.Background(), []Check{
		{Name: "a", Run: func(context.Context) Outcome { return passf("fine") }},
		{Name: "b", Run: func(context.Context) Outcome { return failf("do this", "broken\nsecond line") }},
		{Name: "c", Run: func(context.Context) Outcome { return skipf("n/a") }},
	})
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{"CHECK", "a      PASS    ", "b      FAIL    ", "broken; second line", "c      SKIP    ", "b FAILED: broken\nsecond line\n  change: do this", "1 check(s) failed"} {
		if !strings.Contains(out, s) {
			t.Errorf("text report lacks %q:\n%s", s, out)
		}
	}
	b.Reset()
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Pass || len(back.Checks) != 3 || back.Checks[1].Fix != "do this" {
		t.Errorf("JSON report: %v %+v", err, back)
	}
}

// TestContainerCanary: with [api] containers on, the canary drives a
// sandbox of one container of the node's first container template (or
// the one named) through create, exec, a streamed file, snapshot and
// rollback, the containment check from the container, delete and the
// leftover check, each its own row; a failure
// names what to change. With containers off, or no container template
// the token sees, it is one row that does not fail the run.
func TestContainerCanary(t *testing.T) {
	clean := func() fakeAPI {
		return fakeAPI{"/nodes/pve/lxc": []map[string]any{{"vmid": 9101, "name": "zz-ct", "template": 1}, {"vmid": 9100, "name": "ct-debian", "template": 1},
			{"vmid": 200, "name": "a-running-ct", "template": 0}}, "/cluster/sdn/zones?pending=1": []map[string]any{}}
	}
	steps := []string{"canary (container): create", "canary (container): exec", "canary (container): file, streaming path",
		"canary (container): snapshot and rollback", "canary (container): containment check", "canary (container): delete", "canary (container): nothing left behind"}
	withTemplate := append([]string{"canary (container): template"}, steps...)
	for _, tc := range []struct {
		name     string
		o        CanaryOptions
		fault    func(*fakeSandboxes, fakeAPI)
		rows     []string
		want     map[string]Status // the rows not named pass
		detail   string            // in the first failure's or warning's detail
		template string            // the create's template ("": no create)
	}{
		{name: "containers off", o: CanaryOptions{}, rows: []string{"canary (container)"},
			want: map[string]Status{"canary (container)": Skip}},
		{name: "the node's first container template", o: CanaryOptions{Containers: true}, rows: withTemplate, template: "ct-debian"},
		{name: "the template named", o: CanaryOptions{Containers: true, CTTemplate: "zz-ct"}, rows: steps, template: "zz-ct"},
		{name: "no container template", o: CanaryOptions{Containers: true}, fault: func(_ *fakeSandboxes, px fakeAPI) {
			px["/nodes/pve/lxc"] = []map[string]any{{"vmid": 200, "name": "a-running-ct", "template": 0}}
		}, rows: []string{"canary (container): template"}, want: map[string]Status{"canary (container): template": Warn}, detail: "sees no container template"},
		{name: "container list refused", o: CanaryOptions{Containers: true}, fault: func(_ *fakeSandboxes, px fakeAPI) { delete(px, "/nodes/pve/lxc") },
			rows: []string{"canary (container): template"}, want: map[string]Status{"canary (container): template": Fail}, detail: "GET /nodes/pve/lxc"},
		{name: "create fails", o: CanaryOptions{Containers: true, CTTemplate: "ct-debian"}, fault: func(f *fakeSandboxes, _ fakeAPI) {
			f.failCreate = errors.New(`container template 9100 is not an unprivileged container without features, devices or mount points: feature flags nesting=1`)
		}, rows: steps, template: "ct-debian", detail: "nesting=1",
			want: map[string]Status{"canary (container): create": Fail, "canary (container): exec": Skip, "canary (container): file, streaming path": Skip,
				"canary (container): snapshot and rollback": Skip, "canary (container): containment check": Skip, "canary (container): delete": Skip, "canary (container): nothing left behind": Skip}},
		{name: "a VM instead", o: CanaryOptions{Containers: true, CTTemplate: "ct-debian"}, fault: func(f *fakeSandboxes, _ fakeAPI) { f.wrongKind = true },
			rows: steps, template: "ct-debian", want: map[string]Status{"canary (container): create": Fail}, detail: "want a container"},
		{name: "rollback restores nothing", o: CanaryOptions{Containers: true, CTTemplate: "ct-debian"}, fault: func(f *fakeSandboxes, _ fakeAPI) { f.noRollback = true },
			rows: steps, template: "ct-debian", want: map[string]Status{"canary (container): snapshot and rollback": Fail}, detail: `"after\n"`},
		{name: "a container row fails", o: CanaryOptions{Containers: true, CTTemplate: "ct-debian"}, fault: func(f *fakeSandboxes, _ fakeAPI) { f.checkFails = true },
			rows: steps, template: "ct-debian", want: map[string]Status{"canary (container): containment check": Fail}, detail: "want blocked, saw open"},
		{name: "container left on Proxmox", o: CanaryOptions{Containers: true, CTTemplate: "ct-debian"}, fault: func(_ *fakeSandboxes, px fakeAPI) {
			px["/nodes/pve/lxc"] = []map[string]any{{"vmid": 9100, "name": "ct-debian", "template": 1}, {"vmid": 100, "name": "pvei-x", "template": 0}}
		}, rows: steps, template: "ct-debian", want: map[string]Status{"canary (container): nothing left behind": Fail}, detail: "left behind: container 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, px := newFakeSandboxes(), clean()
			if tc.fault != nil {
				tc.fault(f, px)
			}
			rep := ContainerCanary(context.Background(), f, px, Node{Name: "pve", TransferStorage: "local"}, tc.o)
			var names []string
			failed := false
			for _, c := range rep.Checks {
				names = append(names, c.Name)
				want := Pass
				if w, ok := tc.want[c.Name]; ok {
					want = w
				}
				if c.Status != want {
					t.Errorf("%s: %s (%s), want %s", c.Name, c.Status, c.Detail, want)
				}
				if (c.Status == Fail || c.Status == Warn) && c.Fix == "" {
					t.Errorf("%s: %s without a fix", c.Name, c.Status)
				}
				failed = failed || c.Status == Fail
			}
			if strings.Join(names, "|") != strings.Join(tc.rows, "|") {
				t.Errorf("rows %q, want %q", names, tc.rows)
			}
			if rep.Pass == failed {
				t.Errorf("report pass %v, a row failed %v", rep.Pass, failed)
			}
			if tc.detail != "" {
				bad := append(rep.Failed(), rep.Warnings()...)
				if len(bad) == 0 || !strings.Contains(bad[0].Detail, tc.detail) {
					t.Errorf("first failure or warning %+v does not name %q", bad, tc.detail)
				}
			}
			switch {
			case tc.template == "" && len(f.requests) > 0:
				t.Errorf("created %+v, want no create", f.requests)
			case tc.template != "" && (len(f.requests) != 1 || len(f.requests[0].VMs) != 1 || f.requests[0].VMs[0].Kind != apitype.KindLXC || f.requests[0].VMs[0].Template != tc.template):
				t.Errorf("creates %+v, want one container of %s", f.requests, tc.template)
			}
			if f.created && !f.deleted {
				t.Error("the container canary's sandbox was not deleted")
			}
		})
	}
}
