package kvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
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
