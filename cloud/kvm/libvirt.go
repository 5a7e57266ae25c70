package kvm

import (
	"context"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Defaults for the libvirt objects nodes live in.
const (
	DefaultURI     = "qemu:///system"
	DefaultNetwork = "pve-nested"
	DefaultBridge  = "virbr-pvenest"
	DefaultSubnet  = "192.168.150.0/24"
	DefaultPool    = "pve-nested"
	DefaultPoolDir = "/var/lib/libvirt/images/pve-nested"
	DefaultLogDir  = "/var/log/libvirt/qemu"
)

// Config says which libvirtd to use and where nodes live in it.
type Config struct {
	// URI is a libvirt connection URI (qemu:///system; a socket=
	// parameter names another unix socket).
	URI string
	// Network is the NAT network pve-bootstrap owns: created (persistent,
	// autostarted) when missing, on Subnet with bridge Bridge.
	Network string
	Bridge  string
	Subnet  netip.Prefix
	// Pool is the directory pool at PoolDir holding the volumes, created
	// when missing.
	Pool, PoolDir string
	// LogDir holds each node's serial console log.
	LogDir string
	// SysRoot is where /sys and /dev are read for the nested check ("/").
	SysRoot string
	// HTTP fetches the cloud image.
	HTTP *http.Client
	// Log receives what happens (optional).
	Log *slog.Logger
	// Now is the clock (optional).
	Now func() time.Time

	// remote is a URI naming another host: its nested virtualization
	// cannot be read from this machine's /sys.
	remote bool
}

// setDefaults fills the fields left empty with the package defaults.
func (c *Config) setDefaults() {
	for _, f := range []struct {
		v   *string
		def string
	}{{&c.Network, DefaultNetwork}, {&c.Bridge, DefaultBridge}, {&c.Pool, DefaultPool}, {&c.PoolDir, DefaultPoolDir}, {&c.LogDir, DefaultLogDir}, {&c.SysRoot, "/"}} {
		if *f.v == "" {
			*f.v = f.def
		}
	}
	if !c.Subnet.IsValid() {
		c.Subnet = netip.MustParsePrefix(DefaultSubnet)
	}
}

// Manager creates, lists, starts, stops, clones and deletes nested nodes as
// libvirt domains. Close it when done.
type Manager struct {
	cfg  Config
	conn *libvirt.Libvirt
	log  *slog.Logger
}

// UnreachableError is a libvirtd that could not be reached.
type UnreachableError struct {
	URI string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("libvirt %s: %v (is libvirtd running? on Ubuntu/Debian: apt install libvirt-daemon-system, then systemctl enable --now libvirtd)", e.URI, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// ErrUnknownNetwork is a --network that libvirt does not have and that is
// not the network pve-bootstrap creates.
var ErrUnknownNetwork = errors.New("unknown libvirt network")

// ErrNotOurs is a domain without pve-bootstrap's metadata tag.
var ErrNotOurs = errors.New("not a pve-bootstrap nested node")

// ErrNameTaken is a node name some libvirt domain already has.
var ErrNameTaken = errors.New("name already taken")

// Dial connects to libvirtd.
func Dial(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.URI == "" {
		cfg.URI = DefaultURI
	}
	u, err := url.Parse(cfg.URI)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("libvirt URI %q: want e.g. %s", cfg.URI, DefaultURI)
	}
	if !strings.HasPrefix(u.Scheme, "qemu") {
		return nil, fmt.Errorf("libvirt URI %q: want a qemu driver URI", cfg.URI)
	}
	cfg.setDefaults()
	// /sys of this machine says nothing about a remote host's KVM.
	cfg.remote = u.Host != ""
	type result struct {
		c   *libvirt.Libvirt
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := libvirt.ConnectToURI(u)
		ch <- result{c, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Disconnect()
			}
		}()
		return nil, &UnreachableError{URI: cfg.URI, Err: ctx.Err()}
	}
	if r.err != nil {
		return nil, &UnreachableError{URI: cfg.URI, Err: r.err}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, conn: r.c, log: log}, nil
}

// Close disconnects from libvirtd.
func (m *Manager) Close() error { return m.conn.Disconnect() }

func (m *Manager) now() time.Time {
	if m.cfg.Now != nil {
		return m.cfg.Now()
	}
	return time.Now()
}

func isCode(err error, code libvirt.ErrorNumber) bool {
	var e libvirt.Error
	return errors.As(err, &e) && e.Code == uint32(code)
}

// Node is a nested Proxmox node as libvirt knows it.
type Node struct {
	Name string
	NodeMeta
	// State is libvirt's domain state ("running", "shut off", ...).
	State     string
	Running   bool
	Autostart bool
	// APIURL is the node's Proxmox API on its reserved address.
	APIURL string
	// SerialLog is the file the serial console is copied to.
	SerialLog string
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
	// Accel is "kvm" (default) or "tcg".
	Accel string
	// Network is the libvirt network (default: the one the Manager owns).
	Network string
	// NoAutostart leaves the domain off at host boot.
	NoAutostart bool

	// kernel boots a kernel directly (tests only).
	kernel *directBoot
}

type directBoot struct{ kernel, initrd, cmdline string }

func newInstanceID(name string) (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return name + "-" + hex.EncodeToString(b), nil
}

// undo is a stack of steps that take back what a failed call made.
type undo []func() error

func (u *undo) push(f func() error) { *u = append(*u, f) }

func (u undo) run(log *slog.Logger) {
	for i := len(u) - 1; i >= 0; i-- {
		if err := u[i](); err != nil {
			log.Warn("undo after a failed step", "err", err)
		}
	}
}

// Create builds a node and starts it. Input is checked before anything is
// made; when a later step fails, what was made is taken back.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (Node, error) {
	if o.Accel == "" {
		o.Accel = "kvm"
	}
	if o.Network == "" {
		o.Network = m.cfg.Network
	}
	spec := DomainSpec{
		Name: o.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, Accel: o.Accel, Pool: m.cfg.Pool,
		Disk: diskVol(o.Name), Seed: seedVol(o.Name), Network: o.Network, MAC: "52:54:00:00:00:00",
		SerialLog: filepath.Join(m.cfg.LogDir, o.Name+"-serial.log"),
	}
	if err := spec.check(); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if o.DiskGiB < 8 {
		return Node{}, fmt.Errorf("create %s: disk %d GiB: want at least 8", o.Name, o.DiskGiB)
	}
	if len(o.UserData) == 0 {
		return Node{}, fmt.Errorf("create %s: no user-data", o.Name)
	}
	if o.Accel == "kvm" && m.cfg.remote {
		m.log.Warn("nested virtualization not checked on a remote libvirt host", "uri", m.cfg.URI)
	} else if o.Accel == "kvm" {
		if err := CheckNested(m.cfg.SysRoot); err != nil {
			return Node{}, fmt.Errorf("create %s: %w (or pass --accel tcg: slow, and the node cannot run VMs)", o.Name, err)
		}
	}
	if err := m.nameFree(o.Name); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if err := m.checkNetwork(o.Network); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	base, err := o.Image.Fetch(ctx, m.cfg.HTTP, o.CacheDir)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	var u undo
	ok := false
	defer func() {
		if !ok {
			u.run(m.log)
		}
	}()
	pool, err := m.ensurePool(&u)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	basePath, err := m.baseVolume(&u, pool, base)
	if err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if _, err := m.createVol(&u, pool, overlayXML(spec.Disk, basePath, o.DiskGiB)); err != nil {
		return Node{}, fmt.Errorf("create %s: disk: %w", o.Name, err)
	}
	id, err := newInstanceID(o.Name)
	if err != nil {
		return Node{}, err
	}
	if err := m.uploadSeed(&u, pool, spec.Seed, Seed{UserData: o.UserData, MetaData: MetaData(id, o.Name)}); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	if o.kernel != nil {
		spec.Kernel, spec.Initrd, spec.Cmdline = o.kernel.kernel, o.kernel.initrd, o.kernel.cmdline
	}
	spec.Meta = NodeMeta{InstanceID: id, Network: o.Network, Created: m.now().UTC().Truncate(time.Second)}
	if err := m.defineAndStart(&u, spec, !o.NoAutostart); err != nil {
		return Node{}, fmt.Errorf("create %s: %w", o.Name, err)
	}
	ok = true
	return m.Get(o.Name)
}

// defineAndStart reserves an address for the node, defines its domain and
// starts it.
func (m *Manager) defineAndStart(u *undo, spec DomainSpec, autostart bool) error {
	mac, err := newMAC()
	if err != nil {
		return err
	}
	addr, err := m.reserve(u, spec.Network, spec.Name, mac)
	if err != nil {
		return err
	}
	spec.MAC, spec.Meta.MAC, spec.Meta.Address = mac, mac, addr.String()
	d, err := spec.Domain()
	if err != nil {
		return err
	}
	return m.define(u, d, autostart)
}

func (m *Manager) define(u *undo, d *libvirtxml.Domain, autostart bool) error {
	x, err := d.Marshal()
	if err != nil {
		return err
	}
	dom, err := m.conn.DomainDefineXML(x)
	if err != nil {
		return fmt.Errorf("define domain: %w", err)
	}
	u.push(func() error {
		if st, _, err := m.conn.DomainGetState(dom, 0); err == nil && libvirt.DomainState(st) != libvirt.DomainShutoff {
			m.conn.DomainDestroy(dom)
		}
		return m.conn.DomainUndefine(dom)
	})
	if autostart {
		if err := m.conn.DomainSetAutostart(dom, 1); err != nil {
			return fmt.Errorf("autostart: %w", err)
		}
	}
	if err := m.conn.DomainCreate(dom); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	return nil
}

func (m *Manager) nameFree(name string) error {
	_, err := m.conn.DomainLookupByName(name)
	if err == nil {
		return fmt.Errorf("a libvirt domain named %s exists (virsh dominfo %s): %w", name, name, ErrNameTaken)
	}
	if !isCode(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("look up domain: %w", err)
	}
	return nil
}

// checkNetwork accepts the owned network (present or not) and any network
// libvirt has.
func (m *Manager) checkNetwork(name string) error {
	if name == m.cfg.Network {
		return nil
	}
	_, err := m.conn.NetworkLookupByName(name)
	if isCode(err, libvirt.ErrNoNetwork) {
		return fmt.Errorf("network %q (see virsh net-list --all; leave --network out to use %s, created when missing): %w", name, m.cfg.Network, ErrUnknownNetwork)
	}
	if err != nil {
		return fmt.Errorf("network %s: %w", name, err)
	}
	return nil
}

// ensureNetwork returns the network, creating the owned one when missing
// and starting it when inactive.
func (m *Manager) ensureNetwork(u *undo, name string) (libvirt.Network, error) {
	n, err := m.conn.NetworkLookupByName(name)
	switch {
	case isCode(err, libvirt.ErrNoNetwork) && name == m.cfg.Network:
		nx, err := NetworkSpec{Name: name, Bridge: m.cfg.Bridge, Subnet: m.cfg.Subnet}.Network()
		if err != nil {
			return n, err
		}
		x, err := nx.Marshal()
		if err != nil {
			return n, err
		}
		if n, err = m.conn.NetworkDefineXML(x); err != nil {
			return n, fmt.Errorf("define network %s: %w", name, err)
		}
		u.push(func() error { return m.conn.NetworkUndefine(n) })
		if err := m.conn.NetworkSetAutostart(n, 1); err != nil {
			return n, fmt.Errorf("network %s: autostart: %w", name, err)
		}
		m.log.Info("network created", "network", name, "subnet", m.cfg.Subnet)
	case isCode(err, libvirt.ErrNoNetwork):
		return n, fmt.Errorf("network %q: %w", name, ErrUnknownNetwork)
	case err != nil:
		return n, fmt.Errorf("network %s: %w", name, err)
	}
	if active, err := m.conn.NetworkIsActive(n); err != nil {
		return n, fmt.Errorf("network %s: %w", name, err)
	} else if active == 0 {
		if err := m.conn.NetworkCreate(n); err != nil {
			return n, fmt.Errorf("start network %s: %w", name, err)
		}
		u.push(func() error { return m.conn.NetworkDestroy(n) })
	}
	return n, nil
}

// reserve picks the lowest free address of the network's reserved range
// and adds a DHCP host entry for mac, live and in the saved config.
func (m *Manager) reserve(u *undo, netName, host, mac string) (netip.Addr, error) {
	n, err := m.ensureNetwork(u, netName)
	if err != nil {
		return netip.Addr{}, err
	}
	nx, err := m.networkXML(n)
	if err != nil {
		return netip.Addr{}, err
	}
	addr, err := freeAddress(nx)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network %s: %w", netName, err)
	}
	h := libvirtxml.NetworkDHCPHost{MAC: mac, Name: host, IP: addr.String()}
	if err := m.updateHost(n, libvirt.NetworkUpdateCommandAddLast, h); err != nil {
		return netip.Addr{}, fmt.Errorf("network %s: reserve %s: %w", netName, addr, err)
	}
	u.push(func() error { return m.updateHost(n, libvirt.NetworkUpdateCommandDelete, h) })
	return addr, nil
}

func (m *Manager) networkXML(n libvirt.Network) (*libvirtxml.Network, error) {
	x, err := m.conn.NetworkGetXMLDesc(n, 0)
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", n.Name, err)
	}
	var nx libvirtxml.Network
	if err := nx.Unmarshal(x); err != nil {
		return nil, fmt.Errorf("network %s: %w", n.Name, err)
	}
	return &nx, nil
}

func (m *Manager) updateHost(n libvirt.Network, cmd libvirt.NetworkUpdateCommand, h libvirtxml.NetworkDHCPHost) error {
	x, err := h.Marshal()
	if err != nil {
		return err
	}
	flags := libvirt.NetworkUpdateAffectConfig
	if active, err := m.conn.NetworkIsActive(n); err == nil && active == 1 {
		flags |= libvirt.NetworkUpdateAffectLive
	}
	return m.conn.NetworkUpdateCompat(n, cmd, libvirt.NetworkSectionIPDhcpHost, -1, x, flags)
}

// freeAddress finds the network's DHCP subnet and the lowest address of its
// reserved range no host entry uses.
func freeAddress(nx *libvirtxml.Network) (netip.Addr, error) {
	for _, ip := range nx.IPs {
		if ip.DHCP == nil || (ip.Family != "" && ip.Family != "ipv4") {
			continue
		}
		gw, err := netip.ParseAddr(ip.Address)
		if err != nil || !gw.Is4() {
			continue
		}
		bits := int(ip.Prefix)
		if ip.Netmask != "" {
			mk, err := netip.ParseAddr(ip.Netmask)
			if err != nil || !mk.Is4() {
				continue
			}
			bits = 32 - trailingZeros(addrU32(mk))
		}
		p, err := gw.Prefix(bits)
		if err != nil || bits < 16 || bits > 28 {
			return netip.Addr{}, fmt.Errorf("subnet %s/%d: %w", gw, bits, ErrSubnet)
		}
		used := map[netip.Addr]bool{gw: true}
		for _, h := range ip.DHCP.Hosts {
			if a, err := netip.ParseAddr(h.IP); err == nil {
				used[a] = true
			}
		}
		first, last := reservedRange(p)
		for a := first; a.Compare(last) <= 0; a = a.Next() {
			if !used[a] {
				return a, nil
			}
		}
		return netip.Addr{}, fmt.Errorf("no free address left in %s-%s", first, last)
	}
	return netip.Addr{}, errors.New("no IPv4 subnet with DHCP: nodes need a DHCP reservation")
}

func trailingZeros(v uint32) int {
	n := 0
	for n < 32 && v&(1<<n) == 0 {
		n++
	}
	return n
}

// ensurePool returns the storage pool, creating and starting it when
// missing.
func (m *Manager) ensurePool(u *undo) (libvirt.StoragePool, error) {
	p, err := m.conn.StoragePoolLookupByName(m.cfg.Pool)
	if isCode(err, libvirt.ErrNoStoragePool) {
		px, err := PoolXML(m.cfg.Pool, m.cfg.PoolDir)
		if err != nil {
			return p, err
		}
		x, err := px.Marshal()
		if err != nil {
			return p, err
		}
		if p, err = m.conn.StoragePoolDefineXML(x, 0); err != nil {
			return p, fmt.Errorf("define pool %s: %w", m.cfg.Pool, err)
		}
		u.push(func() error { return m.conn.StoragePoolUndefine(p) })
		if err := m.conn.StoragePoolBuild(p, libvirt.StoragePoolBuildNew); err != nil {
			return p, fmt.Errorf("build pool %s: %w", m.cfg.Pool, err)
		}
		u.push(func() error { return m.conn.StoragePoolDelete(p, 0) })
		if err := m.conn.StoragePoolSetAutostart(p, 1); err != nil {
			return p, fmt.Errorf("pool %s: autostart: %w", m.cfg.Pool, err)
		}
		m.log.Info("storage pool created", "pool", m.cfg.Pool, "dir", m.cfg.PoolDir)
	} else if err != nil {
		return p, fmt.Errorf("pool %s: %w", m.cfg.Pool, err)
	}
	if active, err := m.conn.StoragePoolIsActive(p); err != nil {
		return p, fmt.Errorf("pool %s: %w", m.cfg.Pool, err)
	} else if active == 0 {
		if err := m.conn.StoragePoolCreate(p, 0); err != nil {
			return p, fmt.Errorf("start pool %s: %w", m.cfg.Pool, err)
		}
		u.push(func() error { return m.conn.StoragePoolDestroy(p) })
	}
	return p, nil
}

func (m *Manager) createVol(u *undo, p libvirt.StoragePool, vx *libvirtxml.StorageVolume) (libvirt.StorageVol, error) {
	x, err := vx.Marshal()
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	v, err := m.conn.StorageVolCreateXML(p, x, 0)
	if err != nil {
		return v, fmt.Errorf("volume %s: %w", vx.Name, err)
	}
	u.push(func() error { return m.conn.StorageVolDelete(v, 0) })
	return v, nil
}

// baseVolume makes sure the verified image is a volume in the pool, named
// after its digest so a different image never takes its place, and
// returns the volume's path. A volume already there is read back and
// hashed first. An upload is taken back with the rest when the create
// fails.
func (m *Manager) baseVolume(u *undo, p libvirt.StoragePool, file string) (string, error) {
	sum, err := fileSHA512(file)
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	name := strings.TrimSuffix(path.Base(file), ".qcow2") + "-" + sum[:16] + ".qcow2"
	if v, err := m.conn.StorageVolLookupByName(p, name); err == nil {
		// An upload cut short (or a hand edit) leaves a volume under the
		// right name with the wrong bytes: read it back before trusting it.
		h := sha512.New()
		if err := m.conn.StorageVolDownload(v, h, 0, 0, 0); err != nil {
			return "", fmt.Errorf("base image: read back %s: %w", name, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			return "", fmt.Errorf("base image: volume %s in pool %s is not the verified image (sha512 %s, want %s); "+
				"it may back other nodes' disks: check them, then `virsh vol-delete --pool %s %s`", name, m.cfg.Pool, got[:16], sum[:16], m.cfg.Pool, name)
		}
		return m.conn.StorageVolGetPath(v)
	} else if !isCode(err, libvirt.ErrNoStorageVol) {
		return "", fmt.Errorf("base image: %w", err)
	}
	v, err := m.upload(u, p, name, file)
	if err != nil {
		return "", fmt.Errorf("base image: %w", err)
	}
	m.log.Info("base image uploaded to the pool", "volume", name)
	return m.conn.StorageVolGetPath(v)
}

// upload creates a raw volume the size of file and streams file into it.
func (m *Manager) upload(u *undo, p libvirt.StoragePool, name, file string) (libvirt.StorageVol, error) {
	f, err := os.Open(file)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	v, err := m.createVol(u, p, plainVolXML(name, "raw", st.Size()))
	if err != nil {
		return v, err
	}
	if err := m.conn.StorageVolUpload(v, f, 0, uint64(st.Size()), 0); err != nil {
		return v, fmt.Errorf("upload %s: %w", name, err)
	}
	return v, nil
}

// uploadSeed builds the NoCloud seed ISO locally and uploads it as vol.
func (m *Manager) uploadSeed(u *undo, p libvirt.StoragePool, vol string, s Seed) error {
	dir, err := os.MkdirTemp("", "pve-nested-seed-*")
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer os.RemoveAll(dir)
	iso := filepath.Join(dir, "seed.iso")
	if err := WriteSeedISO(iso, s); err != nil {
		return err
	}
	if _, err := m.upload(u, p, vol, iso); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// lookup finds one of our nodes by name.
func (m *Manager) lookup(name string) (libvirt.Domain, NodeMeta, error) {
	if !ValidName(name) {
		return libvirt.Domain{}, NodeMeta{}, fmt.Errorf("node name %q: want lowercase letters, digits and dashes (max 32)", name)
	}
	d, err := m.conn.DomainLookupByName(name)
	if isCode(err, libvirt.ErrNoDomain) {
		return d, NodeMeta{}, fmt.Errorf("node %s: no such domain (pve-bootstrap nested list)", name)
	}
	if err != nil {
		return d, NodeMeta{}, fmt.Errorf("node %s: %w", name, err)
	}
	meta, err := m.meta(d)
	if err != nil {
		return d, NodeMeta{}, fmt.Errorf("node %s: %w", name, err)
	}
	return d, meta, nil
}

func (m *Manager) meta(d libvirt.Domain) (NodeMeta, error) {
	x, err := m.conn.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{MetadataURI}, 0)
	if isCode(err, libvirt.ErrNoDomainMetadata) {
		return NodeMeta{}, ErrNotOurs
	}
	if err != nil {
		return NodeMeta{}, err
	}
	return ParseNodeMeta(x)
}

var stateNames = map[libvirt.DomainState]string{
	libvirt.DomainNostate: "no state", libvirt.DomainRunning: "running", libvirt.DomainBlocked: "blocked",
	libvirt.DomainPaused: "paused", libvirt.DomainShutdown: "shutting down", libvirt.DomainShutoff: "shut off",
	libvirt.DomainCrashed: "crashed", libvirt.DomainPmsuspended: "suspended",
}

func (m *Manager) node(d libvirt.Domain, meta NodeMeta) (Node, error) {
	st, _, err := m.conn.DomainGetState(d, 0)
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", d.Name, err)
	}
	auto, err := m.conn.DomainGetAutostart(d)
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", d.Name, err)
	}
	n := Node{
		Name: d.Name, NodeMeta: meta, State: stateNames[libvirt.DomainState(st)],
		Running: libvirt.DomainState(st) != libvirt.DomainShutoff, Autostart: auto == 1,
		APIURL: apiURL(meta.Address),
	}
	if x, err := m.conn.DomainGetXMLDesc(d, libvirt.DomainXMLInactive); err == nil {
		var dx libvirtxml.Domain
		if dx.Unmarshal(x) == nil && dx.Devices != nil && len(dx.Devices.Serials) > 0 && dx.Devices.Serials[0].Log != nil {
			n.SerialLog = dx.Devices.Serials[0].Log.File
		}
	}
	return n, nil
}

// Get returns one node.
func (m *Manager) Get(name string) (Node, error) {
	d, meta, err := m.lookup(name)
	if err != nil {
		return Node{}, err
	}
	return m.node(d, meta)
}

// List returns every domain carrying our tag; other domains are left out.
func (m *Manager) List() ([]Node, error) {
	doms, _, err := m.conn.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []Node
	for _, d := range doms {
		meta, err := m.meta(d)
		if errors.Is(err, ErrNotOurs) {
			continue
		}
		if err != nil {
			m.log.Warn("domain with an unreadable pve-bootstrap tag", "domain", d.Name, "err", err)
			continue
		}
		n, err := m.node(d, meta)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Start starts a stopped node.
func (m *Manager) Start(ctx context.Context, name string) error {
	d, meta, err := m.lookup(name)
	if err != nil {
		return err
	}
	st, _, err := m.conn.DomainGetState(d, 0)
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	if libvirt.DomainState(st) != libvirt.DomainShutoff {
		return nil
	}
	var u undo
	if _, err := m.ensureNetwork(&u, meta.Network); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	if err := m.conn.DomainCreate(d); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	return nil
}

// Stop asks the node to shut down (ACPI) and, when it is still running
// after grace, powers it off.
func (m *Manager) Stop(ctx context.Context, name string, grace time.Duration) error {
	d, _, err := m.lookup(name)
	if err != nil {
		return err
	}
	return m.stop(ctx, d, grace)
}

func (m *Manager) stop(ctx context.Context, d libvirt.Domain, grace time.Duration) error {
	off := func() (bool, error) {
		st, _, err := m.conn.DomainGetState(d, 0)
		return libvirt.DomainState(st) == libvirt.DomainShutoff, err
	}
	if done, err := off(); err != nil || done {
		return err
	}
	if err := m.conn.DomainShutdown(d); err != nil {
		m.log.Warn("shutdown request failed; powering off", "node", d.Name, "err", err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := m.conn.DomainDestroy(d); err != nil {
				if done, _ := off(); done {
					return nil
				}
				return fmt.Errorf("stop %s: power off: %w", d.Name, err)
			}
			return nil
		case <-tick.C:
			done, err := off()
			if err != nil {
				return fmt.Errorf("stop %s: %w", d.Name, err)
			}
			if done {
				return nil
			}
		}
	}
}

// Delete powers a node off, removes its domain, volumes, address
// reservation and (on a local libvirt) its serial log.
func (m *Manager) Delete(ctx context.Context, name string) error {
	d, meta, err := m.lookup(name)
	if err != nil {
		return err
	}
	if err := m.stop(ctx, d, 0); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	n, _ := m.node(d, meta)
	if err := m.conn.DomainUndefine(d); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	var errs []error
	if p, err := m.conn.StoragePoolLookupByName(m.cfg.Pool); err == nil {
		for _, vol := range []string{diskVol(name), seedVol(name)} {
			v, err := m.conn.StorageVolLookupByName(p, vol)
			if isCode(err, libvirt.ErrNoStorageVol) {
				continue
			}
			if err == nil {
				err = m.conn.StorageVolDelete(v, 0)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", vol, err))
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("pool %s: %w", m.cfg.Pool, err))
	}
	if nw, err := m.conn.NetworkLookupByName(meta.Network); err == nil {
		h := libvirtxml.NetworkDHCPHost{MAC: meta.MAC, Name: name, IP: meta.Address}
		if err := m.updateHost(nw, libvirt.NetworkUpdateCommandDelete, h); err != nil {
			errs = append(errs, fmt.Errorf("network %s: reservation %s: %w", meta.Network, meta.Address, err))
		}
	}
	// The log is a file on the libvirt host: only a local one is ours to
	// remove.
	if n.SerialLog != "" && !m.cfg.remote {
		if err := os.Remove(n.SerialLog); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete %s: domain removed, but: %w", name, err)
	}
	return nil
}
