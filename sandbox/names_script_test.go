package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestNamingScriptOnHostileHosts runs the naming exec's script (hostsRead)
// in mount and UTS namespaces of its own, with a tmpfs over /etc holding
// the guest's /etc/hosts as a hostile template leaves it, then the check
// the agent client's WriteFile makes before its rename (a directory at
// the path, followed through a symlink, refuses the write). A symlink at
// /etc/hosts, to a file or to a directory, is removed (exit 3) so that
// the write lands and nothing it pointed to is touched, as is one at
// /etc/hostname; a directory stays (exit 4) and the write is refused; a
// regular file is printed (exit 0). The hostname is set in every case.
func TestNamingScriptOnHostileHosts(t *testing.T) {
	testkit.RequireRoot(t, "unshare", "mount", "hostname", "head")
	for _, tc := range []struct {
		name, setup string
		exit        string
		writeOK     bool
		out         string
	}{
		{"a regular file", `printf '10.0.0.9 db\n' > /etc/hosts`, "0", true, "10.0.0.9 db"},
		{"a symlink to a file", `printf 'victim\n' > "$T/file"; ln -s "$T/file" /etc/hosts`, "3", true, ""},
		{"a symlink to a directory", `mkdir "$T/dir"; ln -s "$T/dir" /etc/hosts`, "3", true, ""},
		{"a dangling symlink", `ln -s "$T/none" /etc/hosts`, "3", true, ""},
		{"a directory", `mkdir /etc/hosts`, "4", false, ""},
		{"missing", `:`, "4", true, ""},
		{"/etc/hostname a symlink to a directory", `mkdir "$T/dir"; ln -s "$T/dir" /etc/hostname`, "4", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			outer := `set -e; T="$1"; mount -t tmpfs tmpfs /etc; ` + tc.setup + `
set +e; out=$(/bin/sh -c "$2" ` + namingTag + ` web 65537); rc=$?
printf 'exit=%s\nhostname=%s\nout=%s\n' "$rc" "$(hostname)" "$out"
if [ -d /etc/hosts ] || [ -d /etc/hostname ]; then echo write=refused; else echo write=ok; fi
[ ! -e "$T/file" ] || printf 'file=%s\n' "$(cat "$T/file")"
[ ! -e "$T/dir" ] || echo dir=kept`
			b, err := exec.Command("unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c", outer, "sh", dir, hostsRead).CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, b)
			}
			got := string(b)
			want := []string{"exit=" + tc.exit, "hostname=web", "out=" + tc.out}
			if tc.writeOK {
				want = append(want, "write=ok")
			} else {
				want = append(want, "write=refused")
			}
			if _, err := os.Stat(filepath.Join(dir, "file")); err == nil {
				want = append(want, "file=victim")
			}
			if _, err := os.Stat(filepath.Join(dir, "dir")); err == nil {
				want = append(want, "dir=kept")
			}
			for _, w := range want {
				if !strings.Contains(got, w+"\n") {
					t.Errorf("want %q in:\n%s", w, got)
				}
			}
		})
	}
}
