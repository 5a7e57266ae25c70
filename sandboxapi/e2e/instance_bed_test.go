package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// documentedPath is the PATH of an exec's base environment, as the API
// documents it (sandboxapi README, OpenAPI ExecRequest.env; qga.BasePath).
const documentedPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// fakeEnvScript stands in for a sandbox's /usr/bin/env: it leaves a mark
// and answers `env -0` (what the daemon used to read the agent's
// environment with) with a PATH of the tenant's own and a BASH_ENV, and
// runs the real env otherwise.
const fakeEnvScript = `#!/bin/sh
: > /tmp/pwned
if [ "$1" = -0 ]; then
	printf 'PATH=/opt/a-bin:/usr/sbin:/usr/bin:/sbin:/bin\0BASH_ENV=/tmp/a.sh\0HOME=/root\0'
	exit 0
fi
exec /usr/bin/env.real "$@"
`

// TestBedExecEnvNotInherited (issue 34, finding 1): sandbox A replaces
// /usr/bin/env with a script that names its own PATH and a BASH_ENV, runs
// one argv-only exec and is deleted; sandbox B gets A's VMID, and its
// argv-only execs run with the documented base environment (PATH, HOME,
// LANG and the exec's tag): no PATH of A's, no BASH_ENV, no mark of A's script.
// Before the fix the daemon read the environment with the guest's own
// `env -0`, cached it per socket path, and B ran with A's.
func TestBedExecEnvNotInherited(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	one := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}
	a, err := e.c.Create(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	// Only the file API and wrapper-path execs (a cwd) before the switch,
	// so nothing argv-only has run in A yet.
	if err := e.c.WriteFile(ctx, a.ID, "vm0", "/root/fake-env", strings.NewReader(fakeEnvScript), -1, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := e.c.Exec(ctx, a.ID, "vm0", apitype.ExecRequest{Cwd: "/",
		Argv: []string{"/bin/sh", "-c", "mv /usr/bin/env /usr/bin/env.real && mv /root/fake-env /usr/bin/env && mkdir -p /opt/a-bin && printf 'touch /tmp/a-ran\\n' > /tmp/a.sh"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("A: replace env: %+v %v", res, err)
	}
	res, err = e.c.Exec(ctx, a.ID, "vm0", apitype.ExecRequest{Argv: []string{"true"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("A: argv exec: %+v %v", res, err)
	}
	if err := e.c.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Create(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.c.Delete(context.WithoutCancel(ctx), b.ID) }()
	if b.VMs[0].VMID != a.VMs[0].VMID {
		t.Fatalf("B got VMID %d, A had %d: the test needs the reused VMID", b.VMs[0].VMID, a.VMs[0].VMID)
	}
	res, err = e.c.Exec(ctx, b.ID, "vm0", apitype.ExecRequest{Argv: []string{"env", "-0"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("B: env: %+v %v", res, err)
	}
	got := strings.Split(strings.TrimSuffix(string(res.Stdout), "\x00"), "\x00")
	base := []string{"PATH=" + documentedPath, "HOME=/root", "LANG=C.UTF-8"}
	if len(got) != len(base)+1 || !slices.Equal(got[:len(base)], base) || !strings.HasPrefix(got[len(base)], "PVE_INSPECT_EXEC=") {
		t.Fatalf("B's argv-only exec ran with %q, want %q and the exec's tag", got, base)
	}
	res, err = e.c.Exec(ctx, b.ID, "vm0", apitype.ExecRequest{Argv: []string{"bash", "-c", `echo "$PATH|$BASH_ENV"; ls /tmp/pwned /tmp/a-ran /opt/a-bin 2>/dev/null; true`}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("B: bash -c: %+v %v", res, err)
	}
	if want := documentedPath + "|\n"; string(res.Stdout) != want {
		t.Fatalf("B: bash -c saw %q, want %q (no trace of A)", res.Stdout, want)
	}
}

// TestBedGuestEnvClean (issue 34, finding 7): a variable in the
// environment of the process that starts the bed reaches no guest: not
// an exec's environment, not the guest's init (/proc/1/environ), not its
// agent's (/proc/<qemu-ga>/environ).
func TestBedGuestEnvClean(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tag := make([]byte, 16)
	_, _ = rand.Read(tag)
	marker := "marker-" + hex.EncodeToString(tag)
	t.Setenv("PVE_INSPECT_TEST_MARKER", marker)
	if !slices.Contains(os.Environ(), "PVE_INSPECT_TEST_MARKER="+marker) {
		t.Fatal("the marker is not in the test's own environment")
	}
	e := newBedEnv(t, ctx, nil)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.c.Delete(context.WithoutCancel(ctx), sb.ID) }()
	script := `set -e
env
echo "--- init"
cat /proc/1/environ | tr '\0' '\n'
p=$(pgrep -x qemu-ga)
[ -n "$p" ] || { echo "no qemu-ga" >&2; exit 3; }
for q in $p; do echo "--- qemu-ga $q"; tr '\0' '\n' < /proc/$q/environ; done`
	for _, req := range []apitype.ExecRequest{
		{Argv: []string{"sh", "-c", script}},                                   // argv only
		{Argv: []string{"sh", "-c", script}, Env: map[string]string{"X": "1"}}, // the wrapper
		{Argv: []string{"sh", "-c", script}, Stdin: []byte("x"), Cwd: "/root"}, // streamed
	} {
		res, err := e.c.Exec(ctx, sb.ID, "vm0", req)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %+v: %+v %v", req, res, err)
		}
		if !bytes.Contains(res.Stdout, []byte("--- qemu-ga ")) {
			t.Fatalf("no agent environment read: %s", res.Stdout)
		}
		if bytes.Contains(res.Stdout, []byte(marker)) {
			t.Fatalf("the test's marker reached the guest:\n%s", res.Stdout)
		}
	}
}
