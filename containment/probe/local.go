package probe

// This file is the probe's local kinds: what the guest's root tries on
// the kernel it runs on, no network involved. They are the rows of a
// container (which shares the node's kernel): the probe makes each call
// and reports what the kernel answered (Result.Calls: the errno, or
// success), or, for KindIDMap, its user namespace's id maps
// (Result.IDMap); the host judges (containment's container.go). Every
// call is harmless whatever the answer: a file is opened for writing and
// closed unwritten, a module call gets no module (a bad descriptor, an
// empty image, a name no module has), a mount has no device and is
// undone at once, a keyring is only looked up, and the nested proc mount
// happens in namespaces that end with the child that made them.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Local target kinds. They take only id, kind and timeout_ms (and paths,
// the two that open files), and a request holds at most one target of
// each.
const (
	// KindIDMap reads /proc/self/uid_map and gid_map (Result.IDMap).
	KindIDMap Kind = "local-idmap"
	// KindProcSys opens Target.Paths (under /proc/) for writing.
	KindProcSys Kind = "local-proc-sys"
	// KindSysfs opens Target.Paths (under /sys/) for writing.
	KindSysfs Kind = "local-sysfs"
	// KindMount mounts a disk file system (one the kernel lists without
	// "nodev" in /proc/filesystems) with a directory as its device, and
	// opens a file by handle (open_by_handle_at) on the root's file system.
	KindMount Kind = "local-mount"
	// KindKeyring looks up the user and session keyrings (keyctl
	// KEYCTL_GET_KEYRING_ID, without creating them).
	KindKeyring Kind = "local-keyring"
	// KindModule calls finit_module (descriptor -1), init_module (an empty
	// image) and delete_module (a name no module has).
	KindModule Kind = "local-module"
	// KindNesting starts a child in new user, PID and mount namespaces
	// (its uid 0 the probe's own) that mounts a proc instance of its own,
	// as a nested container's init must.
	KindNesting Kind = "local-nesting"
)

// LocalKinds are the local kinds, in the order the check asks for them.
var LocalKinds = []Kind{KindIDMap, KindProcSys, KindSysfs, KindMount, KindKeyring, KindModule, KindNesting}

// isLocal reports the local kinds.
func isLocal(k Kind) bool {
	for _, l := range LocalKinds {
		if k == l {
			return true
		}
	}
	return false
}

// OutcomeTried: a local target made its calls (Result.Calls) or read its
// maps (Result.IDMap).
const OutcomeTried Outcome = "tried"

// Call is one call a local target made and what the kernel answered.
type Call struct {
	// Op says what was tried, e.g. "open /proc/sys/kernel/core_pattern for writing".
	Op string `json:"op"`
	// Errno is the error's name (EPERM, ENOSYS, ...; ERRNO<n> for one
	// without a name here); "" when the call succeeded.
	Errno string `json:"errno,omitempty"`
}

// IDExtent is one line of a user namespace's uid_map or gid_map.
type IDExtent struct {
	Type    string `json:"type"` // "uid" or "gid"
	Inside  uint32 `json:"inside"`
	Outside uint32 `json:"outside"`
	Count   uint32 `json:"count"`
}

// Bounds of a local result.
const (
	maxCalls   = 8  // calls in one result
	maxOpLen   = 96 // bytes in a call's op
	maxExtents = 32 // lines of one id map (the kernel allows 340; a container has one)
)

var errnoRE = regexp.MustCompile(`^E[A-Z0-9]{1,15}$`)

// maxPaths bounds the paths of one local target (a call each).
const maxPaths = maxCalls

// validateLocal checks a local target.
func validateLocal(t Target) error {
	if t.Addr != "" || t.Method != "" || t.Path != "" || len(t.Headers) != 0 || t.Name != "" || t.Resolver != "" ||
		t.Host != "" || t.QType != "" || t.Payload != "" || t.Nonce != "" || t.SrcAddr != "" || t.SrcMAC != "" || t.Signal != "" {
		return fmt.Errorf("%s target takes only id, kind, timeout_ms and paths", t.Kind)
	}
	prefix := map[Kind]string{KindProcSys: "/proc/", KindSysfs: "/sys/"}[t.Kind]
	if prefix == "" {
		if len(t.Paths) != 0 {
			return fmt.Errorf("%s target takes no paths", t.Kind)
		}
		return nil
	}
	if len(t.Paths) == 0 || len(t.Paths) > maxPaths {
		return fmt.Errorf("%s target: %d paths, want 1..%d", t.Kind, len(t.Paths), maxPaths)
	}
	for _, p := range t.Paths {
		// the op names the path: it must fit one
		if !strings.HasPrefix(p, prefix) || len(p) > maxOpLen-len("open  for writing") || !printableASCII(p, false) ||
			path.Clean(p) != p {
			return fmt.Errorf("path %q: want a clean path under %s, printable ASCII without spaces, at most %d bytes",
				clip(p, 64), prefix, maxOpLen-len("open  for writing"))
		}
	}
	return nil
}

// validateLocalResult checks the calls and maps of a result: only a
// tried result has them, within bounds.
func validateLocalResult(r Result) error {
	if r.Outcome != OutcomeTried {
		if len(r.Calls) != 0 || len(r.IDMap) != 0 {
			return fmt.Errorf("outcome %s carries calls or an id map", r.Outcome)
		}
		return nil
	}
	if len(r.Calls) == 0 && len(r.IDMap) == 0 {
		return errors.New("tried without calls or an id map")
	}
	if len(r.Calls) > maxCalls {
		return fmt.Errorf("%d calls, at most %d", len(r.Calls), maxCalls)
	}
	for _, c := range r.Calls {
		if c.Op == "" {
			return errors.New("call without op")
		}
		if err := cleanText(c.Op, maxOpLen); err != nil {
			return fmt.Errorf("call op: %w", err)
		}
		if c.Errno != "" && !errnoRE.MatchString(c.Errno) {
			return fmt.Errorf("call errno %q", clip(c.Errno, 16))
		}
	}
	if len(r.IDMap) > 2*maxExtents {
		return fmt.Errorf("%d id map lines, at most %d", len(r.IDMap), 2*maxExtents)
	}
	for _, e := range r.IDMap {
		if e.Type != "uid" && e.Type != "gid" {
			return fmt.Errorf("id map type %q", clip(e.Type, 8))
		}
		if e.Count == 0 {
			return errors.New("id map line with count 0")
		}
	}
	return nil
}

// local runs a local target.
func (p *Prober) local(ctx context.Context, t Target) Result {
	var calls []Call
	var err error
	switch t.Kind {
	case KindIDMap:
		m, err := readIDMaps(p.root())
		if err != nil {
			return Result{Outcome: OutcomeError, Detail: err.Error()}
		}
		return Result{Outcome: OutcomeTried, IDMap: m}
	case KindProcSys, KindSysfs:
		calls = openForWriting(t.Paths)
	case KindMount:
		calls, err = mountCalls(p.root())
	case KindKeyring:
		calls = keyringCalls()
	case KindModule:
		calls = moduleCalls()
	case KindNesting:
		calls, err = nestingCalls(ctx)
	}
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: err.Error()}
	}
	for i := range calls {
		calls[i].Op = clip(calls[i].Op, maxOpLen)
	}
	return Result{Outcome: OutcomeTried, Calls: calls}
}

// root is Root or /.
func (p *Prober) root() string {
	if p.Root == "" {
		return "/"
	}
	return p.Root
}

// errnoNames name the errors the local kinds meet; others are ERRNO<n>.
var errnoNames = map[syscall.Errno]string{
	syscall.EPERM: "EPERM", syscall.ENOENT: "ENOENT", syscall.EINTR: "EINTR", syscall.EIO: "EIO",
	syscall.ENXIO: "ENXIO", syscall.ENOEXEC: "ENOEXEC", syscall.EBADF: "EBADF", syscall.EAGAIN: "EAGAIN",
	syscall.ENOMEM: "ENOMEM", syscall.EACCES: "EACCES", syscall.EFAULT: "EFAULT", syscall.ENOTBLK: "ENOTBLK",
	syscall.EBUSY: "EBUSY", syscall.EEXIST: "EEXIST", syscall.ENODEV: "ENODEV", syscall.ENOTDIR: "ENOTDIR",
	syscall.EISDIR: "EISDIR", syscall.EINVAL: "EINVAL", syscall.ENOSPC: "ENOSPC", syscall.EROFS: "EROFS",
	syscall.ENOSYS: "ENOSYS", syscall.ELOOP: "ELOOP", syscall.ENOKEY: "ENOKEY", syscall.EKEYREVOKED: "EKEYREVOKED",
	syscall.EUSERS: "EUSERS", syscall.EOPNOTSUPP: "EOPNOTSUPP", syscall.ESTALE: "ESTALE", syscall.ETXTBSY: "ETXTBSY",
	syscall.ENAMETOOLONG: "ENAMETOOLONG", syscall.EMFILE: "EMFILE", syscall.ENFILE: "ENFILE",
}

// errnoName is err's errno name ("" for nil; EUNKNOWN for an error that
// carries no errno).
func errnoName(err error) string {
	if err == nil {
		return ""
	}
	var e syscall.Errno
	if !errors.As(err, &e) {
		return "EUNKNOWN"
	}
	if n, ok := errnoNames[e]; ok {
		return n
	}
	return "ERRNO" + strconv.Itoa(int(e))
}

// readIDMaps reads the process's uid and gid maps (root/proc/self/uid_map
// and gid_map: "inside outside count" per line).
func readIDMaps(root string) ([]IDExtent, error) {
	var out []IDExtent
	for _, typ := range []string{"uid", "gid"} {
		b, err := os.ReadFile(filepath.Join(root, "proc/self", typ+"_map"))
		if err != nil {
			return nil, fmt.Errorf("id map: %w", err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if n == maxExtents {
				return nil, fmt.Errorf("id map: %s_map has more than %d lines", typ, maxExtents)
			}
			var v [3]uint32
			if len(f) != 3 {
				return nil, fmt.Errorf("id map: %s_map line %q", typ, clip(line, 64))
			}
			for i, s := range f {
				x, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("id map: %s_map line %q", typ, clip(line, 64))
				}
				v[i] = uint32(x)
			}
			if v[2] == 0 {
				return nil, fmt.Errorf("id map: %s_map line %q has count 0", typ, clip(line, 64))
			}
			out = append(out, IDExtent{Type: typ, Inside: v[0], Outside: v[1], Count: v[2]})
			n++
		}
	}
	return out, nil
}
