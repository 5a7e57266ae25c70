package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netns"
)

// FlushFrom deletes the conntrack entries of namespace ns (netns.None():
// this one) whose original source is in one of prefixes, and returns how
// many it deleted. A sandbox's new instance starts with none of an
// earlier instance's connections on its addresses: nothing deletes a
// deleted sandbox's entries (an established TCP entry stays for days),
// and while one stays the remote peer's replies to it are forwarded to
// whichever guest holds the address now, and a later resync of the flow
// record would count it as the new instance's.
func FlushFrom(ns netns.NsHandle, prefixes []netip.Prefix) (int, error) {
	if len(prefixes) == 0 {
		return 0, nil
	}
	cfg := &netlink.Config{}
	if ns != netns.None() {
		cfg.NetNS = int(ns)
	}
	c, err := conntrack.Dial(cfg)
	if err != nil {
		return 0, fmt.Errorf("conntrack: dial: %w", err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		return 0, fmt.Errorf("conntrack: dump: %w", err)
	}
	n := 0
	var errs []error
	for _, f := range flows {
		if !inPrefixes(prefixes, f.TupleOrig.IP.SourceAddress) {
			continue
		}
		if err := c.Delete(f); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				continue // ended between the dump and the delete
			}
			errs = append(errs, err)
			continue
		}
		n++
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("conntrack: delete %d of the entries from %v: %w", len(errs), prefixes, errs[0])
	}
	return n, nil
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
