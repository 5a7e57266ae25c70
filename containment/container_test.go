package containment

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestContainerPlan: Spec.Container adds one row per local kind, in
// order, expected denied under every policy, after the network rows and
// never sampled; the proc-sys and sysfs rows carry the check's paths.
// Without it a plan has none.
func TestContainerPlan(t *testing.T) {
	for _, pol := range []Policy{GuardPolicy(), LockdownPolicy(), WithEgress(GuardPolicy(), "none")} {
		spec := goldenSpec()
		spec.Container = true
		spec.Budget = 1 // every sampled row out: the container rows stay
		p, err := NewPlan(spec, pol)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []probe.Kind
		for _, c := range p.Checks {
			if c.Group != GroupContainer {
				if len(kinds) > 0 {
					t.Errorf("%s: network row %q after the container rows", pol.Name, c.Name)
				}
				continue
			}
			kinds = append(kinds, c.Target.Kind)
			if c.Expect != Denied || c.Control || c.sample.IsValid() {
				t.Errorf("%s: %s: expect %s control %v sampled %v", pol.Name, c.Name, c.Expect, c.Control, c.sample.IsValid())
			}
			switch c.Target.Kind {
			case probe.KindProcSys:
				if !slices.Equal(c.Target.Paths, ProcSysPaths) {
					t.Errorf("proc-sys paths %v", c.Target.Paths)
				}
			case probe.KindSysfs:
				if !slices.Equal(c.Target.Paths, SysfsPaths) {
					t.Errorf("sysfs paths %v", c.Target.Paths)
				}
			}
		}
		if !slices.Equal(kinds, probe.LocalKinds) {
			t.Errorf("%s: container rows %v, want %v", pol.Name, kinds, probe.LocalKinds)
		}
		if err := probe.ValidateRequest(p.request(0, signalPlaceholder)); err != nil {
			t.Errorf("%s: the probe refuses the plan: %v", pol.Name, err)
		}
	}
	p, err := NewPlan(goldenSpec(), GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Checks {
		if c.Group == GroupContainer || isContainerRow(c) {
			t.Errorf("a VM's plan has container row %q", c.Name)
		}
	}
}

// call is a probe call for the table below.
func call(op, errno string) probe.Call { return probe.Call{Op: op, Errno: errno} }

// TestObserveContainer: how the kernel's answers read, row by row: the
// refusals are denied, success or any answer past the permission check
// is allowed, and answers that say nothing (a missing knob, a kernel
// without modules) are no verdict; a row without any verdict is an error.
func TestObserveContainer(t *testing.T) {
	for _, c := range []struct {
		name   string
		kind   probe.Kind
		calls  []probe.Call
		want   Verdict
		detail string
	}{
		{"sysctls refused", probe.KindProcSys, []probe.Call{call("open a", "EACCES"), call("open b", "ENOENT"), call("open c", "EROFS")}, Denied, "open b: ENOENT"},
		{"a sysctl writable", probe.KindProcSys, []probe.Call{call("open a", "EACCES"), call("open b", "")}, Allowed, "open b: succeeded"},
		{"no knob exists", probe.KindProcSys, []probe.Call{call("open a", "ENOENT")}, Errored, "no call gave a verdict"},
		{"sysfs refused", probe.KindSysfs, []probe.Call{call("open a", "EPERM")}, Denied, ""},
		{"sysfs odd answer", probe.KindSysfs, []probe.Call{call("open a", "EACCES"), call("open b", "EISDIR")}, Allowed, "EISDIR"},
		{"mount refused", probe.KindMount, []probe.Call{call("mount ext4", "EPERM"), call("open_by_handle_at", "EPERM")}, Denied, ""},
		{"mount got to the device", probe.KindMount, []probe.Call{call("mount ext4", "ENOTBLK"), call("open_by_handle_at", "EPERM")}, Allowed, "ENOTBLK"},
		{"handle decoded", probe.KindMount, []probe.Call{call("mount ext4", "EPERM"), call("open_by_handle_at", "ESTALE")}, Allowed, "ESTALE"},
		{"keyctl filtered", probe.KindKeyring, []probe.Call{call("keyctl user", "ENOSYS"), call("keyctl session", "ENOSYS")}, Denied, ""},
		{"keyctl answers", probe.KindKeyring, []probe.Call{call("keyctl user", "ENOSYS"), call("keyctl session", "ENOKEY")}, Allowed, "ENOKEY"},
		{"modules refused", probe.KindModule, []probe.Call{call("finit", "EPERM"), call("init", "EPERM"), call("delete", "EPERM")}, Denied, ""},
		{"no module support", probe.KindModule, []probe.Call{call("finit", "ENOSYS"), call("init", "ENOSYS")}, Errored, "no call gave a verdict"},
		{"module call past the check", probe.KindModule, []probe.Call{call("finit", "EBADF"), call("init", "EPERM")}, Allowed, "EBADF"},
		{"nested proc refused", probe.KindNesting, []probe.Call{call("clone", ""), call("mount proc", "EPERM")}, Denied, "clone: succeeded"},
		{"no user namespace", probe.KindNesting, []probe.Call{call("clone", "ENOSPC")}, Denied, ""},
		{"nested proc mounted", probe.KindNesting, []probe.Call{call("clone", ""), call("mount proc", "")}, Allowed, ""},
		{"the mount past its check", probe.KindNesting, []probe.Call{call("clone", ""), call("mount proc", "EINVAL")}, Allowed, "EINVAL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, detail := observeContainer(Check{Target: probe.Target{Kind: c.kind}}, probe.Result{Outcome: probe.OutcomeTried, Calls: c.calls})
			if got != c.want || !strings.Contains(detail, c.detail) {
				t.Errorf("%s (%s), want %s with %q", got, detail, c.want, c.detail)
			}
		})
	}
	for _, r := range []probe.Result{{Outcome: probe.OutcomeError, Detail: "nesting: start the child: exec format error"}, {Outcome: probe.OutcomeTimeout},
		{Outcome: probe.OutcomeTried}} {
		if got, detail := observeContainer(Check{Target: probe.Target{Kind: probe.KindNesting}}, r); got != Errored {
			t.Errorf("%+v: %s (%s), want error", r, got, detail)
		}
	}
}

// TestJudgeIDMap: denied only when uid and gid 0 are mapped and nothing
// maps below the unprivileged range.
func TestJudgeIDMap(t *testing.T) {
	ext := func(typ string, in, out, n uint32) probe.IDExtent {
		return probe.IDExtent{Type: typ, Inside: in, Outside: out, Count: n}
	}
	for _, c := range []struct {
		name   string
		m      []probe.IDExtent
		want   Verdict
		detail string
	}{
		{"pve-container's", []probe.IDExtent{ext("uid", 0, 100000, 65536), ext("gid", 0, 100000, 65536)}, Denied, "uid 0 100000 65536; gid 0 100000 65536"},
		{"another range above", []probe.IDExtent{ext("uid", 0, 200000, 65536), ext("gid", 0, 200000, 65536)}, Denied, ""},
		{"privileged", []probe.IDExtent{ext("uid", 0, 0, 4294967295), ext("gid", 0, 0, 4294967295)}, Allowed, "uid 0 is node uid 0"},
		{"one id passed through", []probe.IDExtent{ext("uid", 0, 100000, 1000), ext("uid", 1000, 1000, 1), ext("gid", 0, 100000, 65536)}, Allowed, "uid 1000 is node uid 1000"},
		{"gid only", []probe.IDExtent{ext("uid", 0, 100000, 65536), ext("gid", 0, 99999, 65536)}, Allowed, "gid 0 is node gid 99999"},
		{"root unmapped", []probe.IDExtent{ext("uid", 1, 100001, 10), ext("gid", 0, 100000, 10)}, Errored, "unmapped"},
		{"nothing", nil, Errored, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, detail := judgeIDMap(c.m)
			if got != c.want || !strings.Contains(detail, c.detail) {
				t.Errorf("%s (%s), want %s with %q", got, detail, c.want, c.detail)
			}
		})
	}
}

// TestGoldenTableContainer renders the check of a container: the network
// rows as in table.golden, the container rows as the bed's unprivileged
// container answers them (container_bed_test.go), but for the nesting
// feature's proc mount, a leak.
func TestGoldenTableContainer(t *testing.T) {
	spec := goldenSpec()
	spec.Container = true
	plan, err := NewPlan(spec, GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	rep := goldenReport(plan)
	answers := map[probe.Kind]probe.Result{
		probe.KindIDMap: {IDMap: []probe.IDExtent{{Type: "uid", Outside: 100000, Count: 65536}, {Type: "gid", Outside: 100000, Count: 65536}}},
		probe.KindProcSys: {Calls: []probe.Call{call("open /proc/sys/kernel/core_pattern for writing", "EACCES"),
			call("open /proc/sys/kernel/modprobe for writing", "ENOENT"), call("open /proc/sys/kernel/printk for writing", "EACCES")}},
		probe.KindSysfs: {Calls: []probe.Call{call("open /sys/kernel/uevent_helper for writing", "ENOENT"),
			call("open /sys/power/state for writing", "EACCES")}},
		probe.KindMount:   {Calls: []probe.Call{call("mount ext4 (a disk file system)", "EPERM"), call("open_by_handle_at on /", "EPERM")}},
		probe.KindKeyring: {Calls: []probe.Call{call("keyctl get the user keyring", "ENOSYS"), call("keyctl get the session keyring", "ENOSYS")}},
		probe.KindModule: {Calls: []probe.Call{call("finit_module (descriptor -1)", "EPERM"), call("init_module (an empty image)", "EPERM"),
			call("delete_module pve_inspect_no_such_module", "EPERM")}},
		probe.KindNesting: {Calls: []probe.Call{call("clone new user, PID and mount namespaces", ""), call("mount proc in them", "")}},
	}
	for i, c := range plan.Checks {
		if a, ok := answers[c.Target.Kind]; ok {
			a.ID, a.Outcome = c.Target.ID, probe.OutcomeTried
			rep.Results[i] = a
		}
	}
	res := Evaluate(plan, rep)
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "table-container.golden", text.Bytes())
	var failed []string
	for _, r := range res.Failed() {
		if r.Group == GroupContainer {
			failed = append(failed, r.Name+": "+r.Why)
		}
	}
	if len(failed) != 1 || !strings.Contains(failed[0], "nested container") || !strings.Contains(failed[0], "LEAK") {
		t.Errorf("failed container rows %q, want the nesting row, a leak", failed)
	}
}
