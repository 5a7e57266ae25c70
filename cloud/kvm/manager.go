package kvm

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/provision"
)

// DefaultDir is where nested nodes live.
const DefaultDir = "/var/lib/pve-bootstrap/nested"

// Files in a node's directory.
const (
	diskFile     = "disk.qcow2"
	seedFile     = "seed.iso"
	userDataFile = "user-data"
	pidFile      = "qemu.pid"
	qmpFile      = "qmp.sock"
	serialFile   = "serial.log"
	nodeFile     = "vm.json"
)

// Node is a nested Proxmox node as recorded in its vm.json.
type Node struct {
	Name       string    `json:"name"`
	InstanceID string    `json:"instance_id"`
	CPUs       int       `json:"cpus"`
	MemoryMiB  int       `json:"memory_mib"`
	Accel      string    `json:"accel"`
	Forwards   []Forward `json:"forwards"`
	Created    time.Time `json:"created"`
	ClonedFrom string    `json:"cloned_from,omitempty"`
	// Dir, Running and PID are filled when read, not stored.
	Dir     string `json:"-"`
	Running bool   `json:"-"`
	PID     int    `json:"-"`
}

// Manager creates, lists, clones and deletes nested nodes.
type Manager struct {
	// Dir holds one directory per node.
	Dir string
	// Runner runs qemu-img and qemu-system-x86_64.
	Runner provision.Runner
	// HTTP fetches the cloud image.
	HTTP *http.Client
	// SysRoot is where /sys and /dev are read for the nested check ("/").
	SysRoot string
	// QEMU is the emulator binary (default qemu-system-x86_64).
	QEMU string
	// Now is the clock.
	Now func() time.Time
	// Log receives warnings (optional).
	Log *slog.Logger
}

// CreateOptions describe a new node.
type CreateOptions struct {
	Name      string
	Image     Image
	CacheDir  string
	UserData  []byte
	CPUs      int
	MemoryMiB int
	DiskGiB   int
	Accel     string
	Forwards  []Forward
}

func (m *Manager) qemu() string {
	if m.QEMU != "" {
		return m.QEMU
	}
	return "qemu-system-x86_64"
}

func (m *Manager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func (m *Manager) nodeDir(name string) (string, error) {
	if !ValidName(name) {
		return "", fmt.Errorf("node name %q: want lowercase letters, digits and dashes (max 32)", name)
	}
	return filepath.Join(m.Dir, name), nil
}

func newInstanceID(name string) (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return name + "-" + hex.EncodeToString(b), nil
}

// Spec is the QEMU spec of a recorded node.
func (n Node) Spec() VMSpec {
	return VMSpec{
		Name: n.Name, Disk: filepath.Join(n.Dir, diskFile), Seed: filepath.Join(n.Dir, seedFile),
		CPUs: n.CPUs, MemoryMiB: n.MemoryMiB, Accel: n.Accel, Forwards: n.Forwards,
		SerialLog: filepath.Join(n.Dir, serialFile), PIDFile: filepath.Join(n.Dir, pidFile),
		QMPSocket: filepath.Join(n.Dir, qmpFile), Daemonize: true,
	}
}

// Create builds a node and starts it.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (Node, error) {
	dir, err := m.nodeDir(o.Name)
	if err != nil {
		return Node{}, err
	}
	if o.Accel == "" {
		o.Accel = "kvm"
	}
	if o.Accel == "kvm" {
		if err := CheckNested(m.SysRoot); err != nil {
			return Node{}, err
		}
	}
	if o.DiskGiB < 8 {
		return Node{}, fmt.Errorf("create %s: disk %d GiB: want at least 8", o.Name, o.DiskGiB)
	}
	if len(o.UserData) == 0 {
		return Node{}, fmt.Errorf("create %s: no user-data", o.Name)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Node{}, fmt.Errorf("create %s: %s already exists", o.Name, dir)
		}
		if err := os.MkdirAll(m.Dir, 0o700); err != nil {
			return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
		}
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	id, err := newInstanceID(o.Name)
	if err != nil {
		return Node{}, err
	}
	n := Node{Name: o.Name, InstanceID: id, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, Accel: o.Accel, Forwards: o.Forwards, Created: m.now().UTC(), Dir: dir}
	if _, err := n.Spec().Args(); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	base, err := o.Image.Fetch(ctx, m.HTTP, o.CacheDir)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	disk := filepath.Join(dir, diskFile)
	if _, err := m.Runner.Run(ctx, provision.Cmd{Argv: []string{"qemu-img", "create", "-f", "qcow2", "-F", "qcow2", "-b", base, disk, strconv.Itoa(o.DiskGiB) + "G"}}); err != nil {
		return Node{}, fmt.Errorf("create %s: overlay: %w", o.Name, err)
	}
	if err := m.writeSeed(n, o.UserData); err != nil {
		return Node{}, err
	}
	if err := m.save(n); err != nil {
		return Node{}, err
	}
	if err := m.start(ctx, n); err != nil {
		return Node{}, err
	}
	ok = true
	return m.read(o.Name)
}

func (m *Manager) writeSeed(n Node, userData []byte) error {
	if err := os.WriteFile(filepath.Join(n.Dir, userDataFile), userData, 0o600); err != nil {
		return fmt.Errorf("seed %s: %w", n.Name, err)
	}
	return WriteSeedISO(filepath.Join(n.Dir, seedFile), Seed{UserData: userData, MetaData: MetaData(n.InstanceID, n.Name)})
}

func (m *Manager) save(n Node) error {
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.Dir, nodeFile), append(b, '\n'), 0o600)
}

func (m *Manager) start(ctx context.Context, n Node) error {
	args, err := n.Spec().Args()
	if err != nil {
		return err
	}
	if _, err := m.Runner.Run(ctx, provision.Cmd{Argv: append([]string{m.qemu()}, args...)}); err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	return nil
}

// Start starts a stopped node.
func (m *Manager) Start(ctx context.Context, name string) error {
	n, err := m.read(name)
	if err != nil {
		return err
	}
	if n.Running {
		return nil
	}
	return m.start(ctx, n)
}

// read loads a node and whether its QEMU runs.
func (m *Manager) read(name string) (Node, error) {
	dir, err := m.nodeDir(name)
	if err != nil {
		return Node{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, nodeFile))
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", name, err)
	}
	var n Node
	if err := json.Unmarshal(b, &n); err != nil {
		return Node{}, fmt.Errorf("node %s: %w", name, err)
	}
	n.Dir = dir
	n.PID, n.Running = m.running(n)
	return n, nil
}

// running reads the node's pid file and checks that the process is this
// node's QEMU (its command line names this node's disk), so a recycled pid
// is never mistaken for it.
func (m *Manager) running(n Node) (int, bool) {
	b, err := os.ReadFile(filepath.Join(n.Dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return 0, false
	}
	if !slices.Contains(strings.Split(string(cmd), "\x00"), "file="+filepath.Join(n.Dir, diskFile)+",if=virtio,format=qcow2,discard=unmap") {
		return 0, false
	}
	return pid, true
}

// List returns every node.
func (m *Manager) List() ([]Node, error) {
	ents, err := os.ReadDir(m.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var out []Node
	for _, e := range ents {
		if !e.IsDir() || !ValidName(e.Name()) {
			continue
		}
		n, err := m.read(e.Name())
		if err != nil {
			continue
		}
		out = append(out, n)
	}
	return out, nil
}

// Stop stops a node's QEMU: an ACPI power-down request over QMP first (the
// guest shuts down cleanly), SIGTERM after grace, SIGKILL ten seconds later.
func (m *Manager) Stop(ctx context.Context, name string, grace time.Duration) error {
	n, err := m.read(name)
	if err != nil {
		return err
	}
	if !n.Running {
		return nil
	}
	if err := qmpCommand(ctx, filepath.Join(n.Dir, qmpFile), "system_powerdown"); err != nil && m.Log != nil {
		m.Log.Warn("power-down request failed; will signal QEMU", "node", name, "err", err)
	}
	steps := []struct {
		after time.Duration
		sig   syscall.Signal
	}{{grace, syscall.SIGTERM}, {10 * time.Second, syscall.SIGKILL}, {10 * time.Second, 0}}
	for _, st := range steps {
		deadline := time.Now().Add(st.after)
		for time.Now().Before(deadline) {
			if _, up := m.running(n); !up {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		if st.sig == 0 {
			break
		}
		// running() just confirmed this pid is this node's QEMU.
		if err := syscall.Kill(n.PID, st.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stop %s: %w", name, err)
		}
	}
	return fmt.Errorf("stop %s: QEMU (pid %d) still running after SIGKILL", name, n.PID)
}

// qmpCommand sends one command over a node's QMP socket.
func qmpCommand(ctx context.Context, sock, cmd string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("qmp: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	r := bufio.NewReader(io.LimitReader(c, 1<<20))
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		return fmt.Errorf("qmp: %w", err)
	}
	for _, req := range []string{`{"execute":"qmp_capabilities"}`, `{"execute":"` + cmd + `"}`} {
		if _, err := io.WriteString(c, req+"\n"); err != nil {
			return fmt.Errorf("qmp: %w", err)
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return fmt.Errorf("qmp: %w", err)
			}
			var resp struct {
				Return json.RawMessage        `json:"return"`
				Error  *struct{ Desc string } `json:"error"`
			}
			if err := json.Unmarshal(line, &resp); err != nil {
				return fmt.Errorf("qmp: %w", err)
			}
			if resp.Error != nil {
				return fmt.Errorf("qmp %s: %s", cmd, resp.Error.Desc)
			}
			if resp.Return != nil {
				break
			}
			// an event: keep reading
		}
	}
	return nil
}

// Delete stops a node and removes its directory.
func (m *Manager) Delete(ctx context.Context, name string) error {
	n, err := m.read(name)
	if err != nil {
		return err
	}
	if err := m.Stop(ctx, name, 10*time.Second); err != nil {
		return err
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// Clone makes dst from the stopped node src: an independent copy of its
// disk, a new instance id (so the recipe makes fresh per-instance secrets)
// and its own forwards; then starts it.
func (m *Manager) Clone(ctx context.Context, src, dst string, forwards []Forward) (Node, error) {
	s, err := m.read(src)
	if err != nil {
		return Node{}, err
	}
	if s.Running {
		return Node{}, fmt.Errorf("clone %s: the source is running; stop it first (pve-bootstrap nested stop %s)", src, src)
	}
	dir, err := m.nodeDir(dst)
	if err != nil {
		return Node{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	id, err := newInstanceID(dst)
	if err != nil {
		return Node{}, err
	}
	n := Node{Name: dst, InstanceID: id, CPUs: s.CPUs, MemoryMiB: s.MemoryMiB, Accel: s.Accel, Forwards: forwards, Created: m.now().UTC(), ClonedFrom: src, Dir: dir}
	if _, err := n.Spec().Args(); err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	if _, err := m.Runner.Run(ctx, provision.Cmd{Argv: []string{"qemu-img", "convert", "-O", "qcow2", filepath.Join(s.Dir, diskFile), filepath.Join(dir, diskFile)}}); err != nil {
		return Node{}, fmt.Errorf("clone %s: copy disk: %w", dst, err)
	}
	ud, err := os.ReadFile(filepath.Join(s.Dir, userDataFile))
	if err != nil {
		return Node{}, fmt.Errorf("clone %s: %w", dst, err)
	}
	if err := m.writeSeed(n, ud); err != nil {
		return Node{}, err
	}
	if err := m.save(n); err != nil {
		return Node{}, err
	}
	if err := m.start(ctx, n); err != nil {
		return Node{}, err
	}
	ok = true
	return m.read(dst)
}
