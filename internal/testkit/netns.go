package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NetNS is a named network namespace owned by one test.
type NetNS struct {
	Name  string
	h     netns.NsHandle
	nl    *netlink.Handle
	once  sync.Once
	close func() error
	err   error
}

// Close deletes the namespace now; the test's clean-up then does nothing.
func (n *NetNS) Close() error {
	n.once.Do(func() { n.err = n.close() })
	return n.err
}

// DropHandles closes the descriptors the namespace is held by in this
// process (its handle and netlink socket); the namespace itself stays
// until the test ends. A benchmark's iterations keep their namespaces to
// the end (deleting one starts the kernel's clean-up, which would run
// into the next timed iteration) but not a thousand descriptors. The
// methods needing a handle must not be called after it.
func (n *NetNS) DropHandles() {
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	if n.h.IsOpen() {
		n.h.Close()
		n.h = netns.None()
	}
}

// RandomName returns prefix plus 4 random hex digits.
func RandomName(prefix string) string {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// ownerDir records which process created each namespace, so a later run
// can remove the namespaces of a run that was killed.
const ownerDir = "/run/pve-inspect-testkit"

// sweepStale deletes namespaces (and their /etc/netns directories) whose
// creating process is gone. Only names recorded in ownerDir are touched.
func sweepStale() error {
	ents, err := os.ReadDir(ownerDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		name := e.Name()
		b, err := os.ReadFile(filepath.Join(ownerDir, name))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
			continue // owner alive
		}
		if _, err := os.Stat(filepath.Join("/run/netns", name)); err == nil {
			if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
				return fmt.Errorf("delete stale netns %s: %v: %s", name, err, out)
			}
		}
		_ = os.RemoveAll(filepath.Join("/etc/netns", name))
		_ = os.Remove(filepath.Join(ownerDir, name))
	}
	return nil
}

// NewNetNS creates a namespace named prefix+4 hex with loopback up and removes
// it (and its /etc/netns/<name> directory) when the test ends. Namespaces
// left by a killed run are swept first.
func NewNetNS(tb testing.TB, prefix string) *NetNS {
	tb.Helper()
	RequireRoot(tb, "ip", "nft")
	if err := sweepStale(); err != nil {
		tb.Fatalf("sweep stale test namespaces: %v", err)
	}
	if err := os.MkdirAll(ownerDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	// Four hex digits collide once a few hundred namespaces are alive (a
	// benchmark's iterations keep theirs until it ends): a name another
	// namespace or owner holds is drawn again.
	var name, owner string
	for attempt := 0; ; attempt++ {
		name = RandomName(prefix)
		owner = filepath.Join(ownerDir, name)
		f, err := os.OpenFile(owner, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, os.ErrExist) && attempt < 20 {
			continue
		}
		if err != nil {
			tb.Fatal(err)
		}
		_, werr := f.WriteString(strconv.Itoa(os.Getpid()))
		if err := errors.Join(werr, f.Close()); err != nil {
			_ = os.Remove(owner)
			tb.Fatal(err)
		}
		out, err := exec.Command("ip", "netns", "add", name).CombinedOutput()
		if err == nil {
			break
		}
		_ = os.Remove(owner)
		if strings.Contains(string(out), "File exists") && attempt < 20 {
			continue
		}
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	n := &NetNS{Name: name}
	n.close = func() error {
		defer os.Remove(owner)
		if n.nl != nil {
			n.nl.Close()
		}
		if n.h.IsOpen() {
			n.h.Close()
		}
		var errs []error
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %v: %s", name, err, out))
		}
		if err := os.RemoveAll(filepath.Join("/etc/netns", name)); err != nil {
			errs = append(errs, fmt.Errorf("remove /etc/netns/%s: %w", name, err))
		}
		return errors.Join(errs...)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	h, err := netns.GetFromName(name)
	if err != nil {
		tb.Fatalf("open netns %s: %v", name, err)
	}
	n.h = h
	if n.nl, err = netlink.NewHandleAt(h); err != nil {
		tb.Fatalf("netlink handle in %s: %v", name, err)
	}
	n.IP(tb, "link", "set", "lo", "up")
	return n
}

// Handle returns the namespace's handle, open until the test ends, for
// code that takes one (firewall.WithNetNS, nftables.WithNetNSFd).
func (n *NetNS) Handle() netns.NsHandle { return n.h }

// Netlink returns the namespace's netlink handle, open until the test
// ends (like any netlink.Handle, not for concurrent use).
func (n *NetNS) Netlink() *netlink.Handle { return n.nl }

// Bridge adds a bridge named name, sets it up, gives it the address cidr
// (none when cidr is "") and returns it. A bridge stands in for any
// interface (an uplink, a storage NIC, a vnet): it needs no peer, and the
// kernels the tests run on need not have the dummy driver.
func (n *NetNS) Bridge(tb testing.TB, name, cidr string) netlink.Link {
	tb.Helper()
	h := n.nl
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		tb.Fatalf("add bridge %s in %s: %v", name, n.Name, err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		tb.Fatalf("bridge %s in %s: %v", name, n.Name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		tb.Fatalf("set %s up in %s: %v", name, n.Name, err)
	}
	if cidr != "" {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			tb.Fatalf("address %q: %v", cidr, err)
		}
		if err := h.AddrAdd(l, a); err != nil {
			tb.Fatalf("add address %s to %s in %s: %v", cidr, name, n.Name, err)
		}
	}
	if l, err = h.LinkByName(name); err != nil {
		tb.Fatalf("bridge %s in %s: %v", name, n.Name, err)
	}
	return l
}

// DefaultVia sets (or replaces) the IPv4 default route through gw on link.
func (n *NetNS) DefaultVia(tb testing.TB, link netlink.Link, gw string) {
	tb.Helper()
	ip := net.ParseIP(gw)
	if ip == nil {
		tb.Fatalf("gateway %q is no IP address", gw)
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: ip,
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	if err := n.nl.RouteReplace(r); err != nil {
		tb.Fatalf("default route via %s in %s: %v", gw, n.Name, err)
	}
}

// IP runs `ip -n <ns> args...` and fails the test on error.
func (n *NetNS) IP(tb testing.TB, args ...string) {
	tb.Helper()
	argv := append([]string{"-n", n.Name}, args...)
	if out, err := exec.Command("ip", argv...).CombinedOutput(); err != nil {
		tb.Fatalf("ip %s: %v: %s", strings.Join(argv, " "), err, out)
	}
}

// NFT loads an nft script into the namespace.
func (n *NetNS) NFT(tb testing.TB, script string) {
	tb.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("nft in %s: %v: %s\n%s", n.Name, err, out, script)
	}
}

// ResolvConf writes /etc/netns/<name>/resolv.conf, which `ip netns exec`
// mounts over /etc/resolv.conf for commands run in the namespace.
func (n *NetNS) ResolvConf(tb testing.TB, content string) {
	tb.Helper()
	dir := filepath.Join("/etc/netns", n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// Command returns argv run inside the namespace by `ip netns exec`.
func (n *NetNS) Command(ctx context.Context, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, argv...)...)
}

// Do runs fn on a thread inside the namespace. Sockets fn creates stay in
// the namespace for their whole life, wherever they are used later.
func (n *NetNS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if err := netns.Set(n.h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// DialContext dials from inside the namespace (it satisfies probe.Dialer).
func (n *NetNS) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Listen opens a listener inside the namespace and closes it at cleanup.
func (n *NetNS) Listen(tb testing.TB, network, address string) net.Listener {
	tb.Helper()
	var l net.Listener
	if err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, address)
		return err
	}); err != nil {
		tb.Fatalf("listen %s %s in %s: %v", network, address, n.Name, err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// ListenPacket opens a packet socket inside the namespace and closes it at cleanup.
func (n *NetNS) ListenPacket(tb testing.TB, network, address string) net.PacketConn {
	tb.Helper()
	var pc net.PacketConn
	if err := n.Do(func() error {
		var err error
		pc, err = net.ListenPacket(network, address)
		return err
	}); err != nil {
		tb.Fatalf("listen %s %s in %s: %v", network, address, n.Name, err)
	}
	tb.Cleanup(func() { pc.Close() })
	return pc
}
