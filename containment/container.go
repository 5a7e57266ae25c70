package containment

// Container rows (Spec.Container): a container shares the node's kernel,
// so besides every network row (its veth is a guest port like a VM's
// tap) the check asks whether the container's root has any power of the
// node's root. Each row is a local kind of the probe (probe/local.go):
// the probe makes harmless calls and reports the kernel's answers; the
// rules below judge them. Every row expects denied whatever the node's
// mode: these walls are the container's configuration (pve-container's
// update_lxc_config for an unprivileged container without features), not
// the guard's.
//
// What each row counts, and why (README "The containment check"):
//
//   - idmap: every line of the probe's uid_map and gid_map maps to node
//     ids at or above UnprivilegedBase, and uid and gid 0 are mapped.
//     pve-container writes "lxc.idmap = u 0 100000 65536" (and g) for an
//     unprivileged container; a privileged one (or a raw idmap passing a
//     node id through) maps below it: allowed.
//   - proc-sys: opening a node-wide sysctl (ProcSysPaths) for
//     writing fails with EACCES, EPERM or EROFS. The kernel keeps these
//     files owned by the node's root, whom the container's user namespace
//     does not map, so even a /proc the container mounts itself gives no
//     write; lxc's read-only /proc/sys is a second layer. Namespaced
//     sysctls (net.*: the container's own network namespace) are not
//     tried: writing them changes only the container. ENOENT (a knob this
//     kernel lacks) is no verdict; at least one knob must answer.
//   - sysfs: the same for node-wide sysfs attributes (SysfsPaths);
//     the container's own network devices (/sys/devices/virtual/net) are
//     its own.
//   - mount: mounting a disk file system (the kernel needs the node's
//     CAP_SYS_ADMIN for any file system without FS_USERNS_MOUNT) and
//     open_by_handle_at on the root's file system (the node's
//     CAP_DAC_READ_SEARCH; lxc's seccomp profile also answers EPERM) both
//     fail with EPERM (or EACCES, an LSM's refusal). A file system of the
//     container's own user namespace (tmpfs, a bind of its own tree, proc
//     or sysfs of its own namespaces) reaches no node path and is not
//     counted; pve-container's AppArmor profile refuses most of those too
//     on a node that has AppArmor.
//   - keyring: keyctl fails with ENOSYS (pve-container's seccomp rule
//     "keyctl errno 38" unless the keyctl feature is on) or EPERM.
//     add_key and request_key are not filtered; on Linux 5.3 and later
//     they reach only the keyrings of the container's own user namespace.
//   - module: finit_module, init_module and delete_module fail with EPERM
//     (lxc's common.seccomp "errno 1" and the node's CAP_SYS_MODULE).
//     ENOSYS, a kernel without module support, is no verdict: the
//     container's refusal was not seen.
//   - nesting: new user, PID and mount namespaces cannot mount a proc of
//     their own: the clone is refused (EPERM, ENOSPC, EUSERS, EACCES) or
//     the mount is (EPERM, EACCES); a clone that succeeds is no verdict by
//     itself (any process may make a user namespace). lxc's /proc has read-only submounts
//     (proc:mixed) that the kernel locks in a new user namespace, so a
//     fresh proc would show more than the container sees and is refused
//     (mount_too_revealing); the nesting feature adds fully visible proc
//     and sysfs instances (lxc.apparmor.allow_nesting, pve-container
//     make_apparmor_config) and AppArmor rules that let it pass.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// Container row verdicts: whether the kernel refused what the container's
// root tried.
const (
	Denied  Verdict = "denied"  // the kernel refused every call that answered
	Allowed Verdict = "allowed" // a call got past the permission check
)

// GroupContainer names the container rows.
const GroupContainer Group = "container"

// UnprivilegedBase is the first node id of an unprivileged container's
// range: pve-container src/PVE/LXC.pm update_lxc_config writes
// "lxc.idmap = u 0 100000 65536" and "g 0 100000 65536" (the node's
// /etc/subuid and /etc/subgid give root 100000:65536). Ids below it are
// the node's root, its system accounts and its users.
const UnprivilegedBase = 100000

// ProcSysPaths are the files the proc-sys row opens for writing:
// node-wide settings (the kernel has one of each, no namespace) whose
// writer could run code as the node's root (core_pattern and modprobe
// name programs the kernel starts in the initial namespaces), reboot or
// stop the node (sysrq-trigger, sysrq), or change it for every tenant. A
// path the kernel lacks is no verdict.
var ProcSysPaths = []string{
	"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/kernel/sysrq",
	"/proc/sysrq-trigger", "/proc/sys/kernel/printk", "/proc/sys/vm/overcommit_memory",
}

// SysfsPaths are the files the sysfs row opens for writing: node-wide
// attributes (the hotplug helper the kernel runs as the node's root, the
// node's power state, memory management for every tenant).
var SysfsPaths = []string{
	"/sys/kernel/uevent_helper", "/sys/power/state", "/sys/kernel/mm/transparent_hugepage/enabled",
	"/sys/kernel/mm/ksm/run", "/sys/kernel/profiling",
}

// containerRows are the container rows, in the order of probe.LocalKinds.
var containerRows = []struct {
	kind probe.Kind
	name string
	why  string
}{
	{probe.KindIDMap, "uid or gid 0 in the container maps below the unprivileged range (the node's root or its accounts)",
		"LEAK: the container's root is the node's root or one of its accounts (privileged container or an id map through)"},
	{probe.KindProcSys, "write the node's kernel settings in /proc/sys (core_pattern, modprobe, sysrq, printk, overcommit)",
		"LEAK: the container's root can change the node's kernel (core_pattern and modprobe run programs as the node's root)"},
	{probe.KindSysfs, "write the node's /sys (uevent_helper, power/state, memory management)",
		"LEAK: the container's root can write the node's sysfs (the hotplug helper runs as the node's root)"},
	{probe.KindMount, "mount a disk file system or open a file by handle (the node's files)",
		"LEAK: the container's root can mount a disk or open the node's files by handle"},
	{probe.KindKeyring, "use the kernel keyrings (keyctl)",
		"LEAK: the container reaches the kernel keyrings (keyctl is open: the keyctl feature or a seccomp profile without its rule)"},
	{probe.KindModule, "load or unload a kernel module",
		"LEAK: the container's root gets past the kernel module calls' refusal (no seccomp rule, CAP_SYS_MODULE of the node)"},
	{probe.KindNesting, "start a nested container (new user, PID and mount namespaces with a proc of their own)",
		"LEAK: the container can start nested containers (the nesting feature, or proc and sysfs fully visible)"},
}

// addContainer adds the container rows: always probed, expected denied.
func addContainer(add func(Check)) {
	for _, r := range containerRows {
		t := probe.Target{Kind: r.kind}
		switch r.kind {
		case probe.KindProcSys:
			t.Paths = slices.Clone(ProcSysPaths)
		case probe.KindSysfs:
			t.Paths = slices.Clone(SysfsPaths)
		}
		add(Check{Group: GroupContainer, Name: r.name, Expect: Denied, Target: t})
	}
}

// isContainerRow reports whether c is a container row.
func isContainerRow(c Check) bool { return slices.Contains(probe.LocalKinds, c.Target.Kind) }

// callRule says how an errno of a container row's call counts: in
// denied, the kernel refused; in noVerdict, the call says nothing either
// way; any other answer, success included, is allowed (the call got past
// its permission check). With steps, a call that succeeded and is not
// the last only led to the next (the nesting row's clone, which its
// mount follows): no verdict.
type callRule struct {
	denied, noVerdict []string
	steps             bool
}

// containerRules are the rules of the rows made of calls (the idmap row
// is judged by judgeIDMap). A call of the nesting row's mount only comes
// after the clone succeeded.
var containerRules = map[probe.Kind]callRule{
	probe.KindProcSys: {denied: []string{"EACCES", "EPERM", "EROFS"}, noVerdict: []string{"ENOENT", "ENOTDIR"}},
	probe.KindSysfs:   {denied: []string{"EACCES", "EPERM", "EROFS"}, noVerdict: []string{"ENOENT", "ENOTDIR"}},
	probe.KindMount:   {denied: []string{"EPERM", "EACCES"}},
	probe.KindKeyring: {denied: []string{"ENOSYS", "EPERM"}},
	probe.KindModule:  {denied: []string{"EPERM"}, noVerdict: []string{"ENOSYS"}},
	probe.KindNesting: {denied: []string{"EPERM", "EACCES", "ENOSPC", "EUSERS"}, steps: true},
}

// observeContainer judges a container row's probe result.
func observeContainer(c Check, r probe.Result) (Verdict, string) {
	switch r.Outcome {
	case probe.OutcomeTried:
	case probe.OutcomeError:
		return Errored, "probe could not try: " + r.Detail
	default:
		return Errored, "unexpected outcome " + string(r.Outcome)
	}
	if c.Target.Kind == probe.KindIDMap {
		return judgeIDMap(r.IDMap)
	}
	rule, ok := containerRules[c.Target.Kind]
	if !ok || len(r.Calls) == 0 {
		return Errored, "no calls for this row"
	}
	var denied, allowed, parts []string
	for i, call := range r.Calls {
		ans := call.Errno
		if ans == "" {
			ans = "succeeded"
		}
		parts = append(parts, call.Op+": "+ans)
		switch {
		case rule.steps && call.Errno == "" && i < len(r.Calls)-1:
		case slices.Contains(rule.denied, call.Errno):
			denied = append(denied, call.Op)
		case slices.Contains(rule.noVerdict, call.Errno):
		default:
			allowed = append(allowed, call.Op)
		}
	}
	detail := strings.Join(parts, "; ")
	switch {
	case len(allowed) > 0:
		return Allowed, detail
	case len(denied) == 0:
		return Errored, detail + " (no call gave a verdict)"
	}
	return Denied, detail
}

// judgeIDMap judges the probe's uid and gid maps: denied when uid and
// gid 0 are mapped and no line reaches a node id below UnprivilegedBase.
func judgeIDMap(m []probe.IDExtent) (Verdict, string) {
	var parts, low []string
	zero := map[string]bool{}
	for _, e := range m {
		parts = append(parts, fmt.Sprintf("%s %d %d %d", e.Type, e.Inside, e.Outside, e.Count))
		if e.Outside < UnprivilegedBase {
			low = append(low, fmt.Sprintf("%s %d is node %s %d", e.Type, e.Inside, e.Type, e.Outside))
		}
		if e.Inside == 0 {
			zero[e.Type] = true
		}
	}
	detail := strings.Join(parts, "; ")
	switch {
	case len(low) > 0:
		return Allowed, detail + ": " + strings.Join(low, ", ")
	case !zero["uid"] || !zero["gid"]:
		return Errored, detail + " (uid or gid 0 unmapped: the probe did not run as the container's root)"
	}
	return Denied, detail
}

// describeContainer renders a container row's target for the table.
func describeContainer(t probe.Target) string {
	switch t.Kind {
	case probe.KindIDMap:
		return "local: /proc/self/uid_map, gid_map"
	case probe.KindProcSys, probe.KindSysfs:
		return "local: open for writing " + strings.Join(t.Paths, ", ")
	case probe.KindMount:
		return "local: mount(2) of a disk file system, open_by_handle_at(2)"
	case probe.KindKeyring:
		return "local: keyctl(2) KEYCTL_GET_KEYRING_ID user, session"
	case probe.KindModule:
		return "local: finit_module(2), init_module(2), delete_module(2)"
	case probe.KindNesting:
		return "local: clone(2) user+pid+mount namespaces, mount(2) proc in them"
	}
	return "local: " + string(t.Kind)
}

// whyContainer explains a container row of kind that reads allowed.
func whyContainer(kind probe.Kind) string {
	for _, c := range containerRows {
		if c.kind == kind {
			return c.why
		}
	}
	return "LEAK: the container's root holds a power of the node's root"
}

// NodeIDMapper is a container's guest that reads the uid and gid maps of
// the container's init from the node (ctguest: /proc/<pid>/uid_map of
// the pid lxc's monitor gives), where nothing in the container can
// change what is read.
type NodeIDMapper interface {
	NodeIDMaps(ctx context.Context) (uid, gid string, err error)
}

// parseIDMaps parses the kernel's uid_map and gid_map text ("inside
// outside count" a line).
func parseIDMaps(uid, gid string) ([]probe.IDExtent, error) {
	var out []probe.IDExtent
	for _, m := range []struct{ typ, text string }{{"uid", uid}, {"gid", gid}} {
		for _, line := range strings.Split(strings.TrimSpace(m.text), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if len(f) != 3 {
				return nil, fmt.Errorf("%s_map line %q: want 3 fields", m.typ, line)
			}
			var v [3]uint32
			for i := range f {
				n, err := strconv.ParseUint(f[i], 10, 32)
				if err != nil {
					return nil, fmt.Errorf("%s_map line %q: %w", m.typ, line, err)
				}
				v[i] = uint32(n)
			}
			out = append(out, probe.IDExtent{Type: m.typ, Inside: v[0], Outside: v[1], Count: v[2]})
		}
	}
	return out, nil
}

// crossCheckIDMap judges res's id map row from the node's own reading of
// the container's maps (uid, gid; or readErr): the row's verdict is the
// node's, and a probe report whose maps differ from them fails the row,
// whatever either says: the container's root answered for the probe
// (a replaced sh, env or setpriv, a traced probe), so no row of this
// report can be trusted. res.Pass is judged again.
func crossCheckIDMap(res *Result, uid, gid string, readErr error) {
	node, err := parseIDMaps(uid, gid)
	if readErr != nil {
		err = readErr
	}
	for i := range res.Rows {
		row := &res.Rows[i]
		if row.kind != probe.KindIDMap {
			continue
		}
		switch {
		case err != nil:
			row.Observed, row.Detail = Errored, "the node could not read the container's id maps: "+err.Error()
		case len(row.idmap) == 0:
			_, d := judgeIDMap(node)
			row.Observed, row.Detail = Errored, "node: "+d+"; the probe reported no maps ("+row.Detail+")"
		case !sameExtents(node, row.idmap):
			v, d := judgeIDMap(node)
			row.Observed, row.Detail = v, "node: "+d+"; the probe reported other maps ("+row.Detail+")"
			row.Status, row.Why = Fail, "FORGED: the probe's report differs from what the node reads of the container's init: the container answered for the probe, so none of this report's rows can be trusted"
			continue
		default:
			v, d := judgeIDMap(node)
			row.Observed, row.Detail = v, "node: "+d+" (the probe's report agrees)"
		}
		row.Status, row.Why = Fail, ""
		if row.Observed == row.Expect {
			row.Status = Pass
		}
		row.Why = why(*row)
	}
	res.Pass = res.Passed()
}

// sameExtents reports whether a and b hold the same extents, in any order.
func sameExtents(a, b []probe.IDExtent) bool {
	if len(a) != len(b) {
		return false
	}
	key := func(e probe.IDExtent) string { return fmt.Sprintf("%s %d %d %d", e.Type, e.Inside, e.Outside, e.Count) }
	seen := map[string]int{}
	for _, e := range a {
		seen[key(e)]++
	}
	for _, e := range b {
		if seen[key(e)]--; seen[key(e)] < 0 {
			return false
		}
	}
	return true
}
