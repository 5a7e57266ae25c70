package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Names and addresses: every VM of a sandbox is called by its name, and
// its siblings resolve that name, in every egress mode.
//
// Design decisions:
//
//   - Addresses are the node's: Proxmox's IPAM entries (GET
//     /cluster/sdn/ipams/pve/status) on the sandbox's own vnets that name
//     the sandbox's own VMIDs, or, for a NIC of a fixed address, the NIC's
//     MAC (fixed.go). The vnet names derive from the sandbox's random id
//     and an IPAM entry goes with its VM, so nothing of another sandbox
//     can match. What the guest says of its addresses is never read.
//   - Names resolve through /etc/hosts, which needs no DNS: the same in
//     egress open, allowlist and none, with or without the zone's
//     resolver. Each guest's /etc/hosts gets a managed block between two
//     marker lines, holding the sandbox's own names only, built from node
//     data only (the API's names, the IPAM's addresses). It is rewritten
//     whole each time and put first in the file (the files database
//     answers with the first line that names a host, so a template's own
//     line for "target" cannot shadow a sibling); lines outside it are the
//     guest's and are kept.
//   - The existing /etc/hosts is read by one exec that refuses a symlink
//     (and removes it: only the link, never what it points to) or
//     anything but a regular file and reads at most maxHostsFile+1
//     bytes (head -c, so the guest never sends more). A symlink, a
//     missing or odd file, or one larger than maxHostsFile is not kept:
//     the guest gets a fresh file (hostsBase and the block). The write is
//     the agent client's WriteFile: a new file of a random name in /etc,
//     renamed over /etc/hosts; a rename replaces a file and never writes
//     through a symlink. A directory at /etc/hosts is left alone: the
//     write refuses it and the naming fails.
//   - The hostname is the VM's name (a DNS label: the API refuses any
//     other name): set with hostname(1) (or /proc/sys/kernel/hostname
//     when the guest has no hostname(1)) in the same exec, and written to
//     /etc/hostname (a symlink there is removed first, as at /etc/hosts).
//   - Names resolve by DNS too: the same names and addresses are handed
//     to the Egress (EgressNamer) before the guests are written, and the
//     daemon's resolver answers them to the sandbox's own guests, in every
//     mode (firewall/egress vmnames.go), for a guest whose /etc/hosts is
//     not read (a resolver that skips NSS, dig). They go with the
//     instance in the Egress; a start hands them over again (Reconcile).
//   - When: once every VM of a cold create answers its agent, before the
//     sandbox is ready; and at a claim, after the member's VM got the
//     sandbox's name. Warm pool members are not named while they wait (a
//     claim names them), so a claimed VM never keeps a previous name.
//   - A failure fails the create (or the claim, which then runs cold):
//     a sandbox whose names do not resolve is not the one the API
//     describes.

const (
	// hostsBegin and hostsEnd delimit the managed block of /etc/hosts.
	hostsBegin = "# BEGIN pve-inspect sandbox names (written by pve-inspectd, replaced whole; edits inside are lost)"
	hostsEnd   = "# END pve-inspect sandbox names"
	// hostsBase starts a fresh /etc/hosts (Debian's localhost lines).
	hostsBase = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	// maxHostsFile is the largest existing /etc/hosts whose lines are
	// kept; a larger one is replaced by a fresh file.
	maxHostsFile = 64 << 10
	// nameTimeout bounds each guest call of naming a VM.
	nameTimeout = 30 * time.Second
)

// hostsRead sets the hostname ($1), removes /etc/hostname when it is a
// symlink, then prints at most $2 bytes of /etc/hosts. Exit 3:
// /etc/hosts was a symlink, now removed; 4: it is missing or not a
// regular file; 5: the hostname could not be set. (The writes that
// follow rename new files into place; a symlink left at either path to a
// directory would have the agent client's WriteFile refuse the path.)
const hostsRead = `if ! hostname "$1" 2>/dev/null; then printf %s "$1" > /proc/sys/kernel/hostname || exit 5; fi
if [ -L /etc/hostname ]; then rm -f /etc/hostname; fi
[ -L /etc/hosts ] && { rm -f /etc/hosts; exit 3; }
[ -f /etc/hosts ] || exit 4
exec head -c "$2" /etc/hosts`

// namingTag is argv[0] of the naming script ($0 of sh -c).
const namingTag = "pve-inspect-names"

// IsNamingExec reports whether r is the exec that names a guest (sets its
// hostname and reads /etc/hosts; its arguments after the script are the
// name and the read bound): guest doubles that run no guest answer it.
func IsNamingExec(r GuestExec) bool {
	return len(r.Argv) == 6 && r.Argv[0] == "/bin/sh" && r.Argv[2] == hostsRead && r.Argv[3] == namingTag
}

// learnAddresses reads the IPAM addresses of rec's VMs into
// rec.VMs[i].Addresses.
func (m *Engine) learnAddresses(ctx context.Context, rec *record) error {
	m.mu.Lock()
	nets := slices.Clone(rec.Networks)
	vms := cloneSandbox(rec.Sandbox).VMs
	m.mu.Unlock()
	vnets := make([]string, len(nets))
	for i, n := range nets {
		vnets[i] = n.VNet
	}
	for _, v := range vms {
		for _, n := range v.Networks {
			if id, ok := apitype.SharedVNetOf(n); ok && !slices.Contains(vnets, id) {
				vnets = append(vnets, id)
			}
		}
	}
	entries, err := m.addrs.IPAMAddresses(ctx, vnets)
	if err != nil {
		return pxErr("list ipam addresses", err)
	}
	// a VM with two NICs on one network has two entries there: only the
	// NICs' MACs (its config) say which is which; a NIC's fixed address
	// names no VM, only the MAC (the record's: fixed.go)
	macs := map[int][]string{}
	cr, _ := m.addrs.(vmConfigReader)
	for _, v := range vms {
		switch {
		case cr != nil && repeats(v.Networks):
			cfg, err := cr.VMConfig(ctx, v.VMID)
			if err != nil {
				return pxErr(fmt.Sprintf("read the NICs of vm %d", v.VMID), err)
			}
			macs[v.VMID] = nicMACs(cfg, len(v.Networks))
		case recordMACs(v) != nil:
			macs[v.VMID] = recordMACs(v)
		}
	}
	found := vmAddresses(nets, vms, entries, macs)
	m.mu.Lock()
	for i := range rec.VMs {
		if i < len(vms) && rec.VMs[i].VMID == vms[i].VMID {
			rec.VMs[i].Addresses = found[i]
		}
	}
	m.mu.Unlock()
	return nil
}

// vmAddresses picks, for each VM, its address on each of its networks
// (NIC order) from the IPAM entries: the entry of the NIC's MAC on the
// network's vnet where macs says the NIC's MAC (macs[vmid][nic]), naming
// the VM or no VM (a fixed address: fixed.go), else the lowest address the
// IPAM holds for the VM's VMID there that no other NIC of the VM took (two
// NICs on one network never show one address twice). Entries of other
// vnets or VMIDs are ignored.
func vmAddresses(nets []apitype.Network, vms []apitype.VM, entries []IPAMAddress, macs map[int][]string) [][]apitype.VMAddress {
	type key struct {
		vnet string
		vmid int
	}
	byKey := map[key][]IPAMAddress{}
	for _, e := range entries {
		if !e.IP.Is4() {
			continue
		}
		k := key{e.VNet, e.VMID}
		byKey[k] = append(byKey[k], e)
	}
	for _, es := range byKey {
		slices.SortFunc(es, func(a, b IPAMAddress) int { return a.IP.Compare(b.IP) })
	}
	out := make([][]apitype.VMAddress, len(vms))
	for i, v := range vms {
		if v.VMID == 0 {
			continue
		}
		used := map[netip.Addr]bool{}
		for j, name := range v.Networks {
			vnet := bridgeOf(nets, name)
			cands := byKey[key{vnet, v.VMID}]
			pick := -1
			if j < len(macs[v.VMID]) && macs[v.VMID][j] != "" {
				byMAC := func(e IPAMAddress) bool { return !used[e.IP] && strings.EqualFold(e.MAC, macs[v.VMID][j]) }
				if pick = slices.IndexFunc(cands, byMAC); pick < 0 {
					cands = byKey[key{vnet, 0}]
					pick = slices.IndexFunc(cands, byMAC)
				}
			}
			if pick < 0 {
				cands = byKey[key{vnet, v.VMID}]
				pick = slices.IndexFunc(cands, func(e IPAMAddress) bool { return !used[e.IP] })
			}
			if pick >= 0 {
				used[cands[pick].IP] = true
				out[i] = append(out[i], apitype.VMAddress{Network: name, IPv4: cands[pick].IP.String()})
			}
		}
	}
	return out
}

// repeats reports whether a name appears twice in names.
func repeats(names []string) bool {
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return true
		}
		seen[n] = true
	}
	return false
}

// nicMACs returns the MACs of a VM's NICs net0..net<n-1> from its config
// ("virtio=BC:24:11:..,bridge=..." or "...,macaddr=..."): "" for a NIC
// without one.
func nicMACs(cfg map[string]string, n int) []string {
	out := make([]string, n)
	for i := range out {
		for _, kv := range strings.Split(cfg[fmt.Sprintf("net%d", i)], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			if _, err := net.ParseMAC(v); err == nil && (k == "macaddr" || out[i] == "") {
				out[i] = strings.ToLower(v)
			}
		}
	}
	return out
}

// hostsBlock is the managed block for VM self of vms: every VM's name with
// the address a VM on self's networks reaches it by (its address on the
// first of self's networks it is also on, else its first address). A VM
// without an address is left out, except self, which is named at
// 127.0.1.1 (Debian's line for a host without a fixed address) so that
// its own name resolves. A VM without any NIC (no_network) reaches none
// of its siblings: its block names itself only.
func hostsBlock(vms []apitype.VM, self int) []byte {
	var b bytes.Buffer
	b.WriteString(hostsBegin + "\n")
	for i, v := range vms {
		if vms[self].NoNetwork && i != self {
			continue
		}
		addr := reachBy(vms[self].Networks, v.Addresses)
		if addr == "" && i == self {
			addr = "127.0.1.1"
		}
		if addr == "" {
			continue
		}
		b.WriteString(addr + "\t" + v.Name + "\n")
	}
	b.WriteString(hostsEnd + "\n")
	return b.Bytes()
}

// reachBy is the address of addrs on the first of nets it has one on,
// else its first address ("" when none).
func reachBy(nets []string, addrs []apitype.VMAddress) string {
	for _, n := range nets {
		for _, a := range addrs {
			if a.Network == n {
				return a.IPv4
			}
		}
	}
	if len(addrs) > 0 {
		return addrs[0].IPv4
	}
	return ""
}

// mergeHosts is the /etc/hosts holding block first and then every line of
// existing outside managed blocks: lines from a begin marker through the
// next end marker go, as does a marker line without its pair. Merging
// the result again with the same block gives the same bytes.
func mergeHosts(existing, block []byte) []byte {
	out := bytes.NewBuffer(slices.Clip(block))
	lines := bytes.SplitAfter(existing, []byte("\n"))
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch string(bytes.TrimRight(l, "\r\n")) {
		case hostsEnd:
			continue
		case hostsBegin:
			end := i + 1
			for end < len(lines) && string(bytes.TrimRight(lines[end], "\r\n")) != hostsEnd {
				end++
			}
			if end < len(lines) {
				i = end
			}
			continue
		}
		out.Write(l)
	}
	if b := out.Bytes(); len(b) > 0 && b[len(b)-1] != '\n' {
		out.WriteByte('\n')
	}
	return out.Bytes()
}

// nameGuests learns rec's addresses and names every VM of rec in its
// guest (hostname, /etc/hostname, the managed block of /etc/hosts), in
// parallel.
func (m *Engine) nameGuests(ctx context.Context, rec *record) error {
	if err := m.learnAddresses(ctx, rec); err != nil {
		return err
	}
	if err := m.nameEgress(ctx, rec); err != nil {
		return err
	}
	m.mu.Lock()
	vms := cloneSandbox(rec.Sandbox).VMs
	m.mu.Unlock()
	g, gctx := errgroup.WithContext(ctx)
	for i := range vms {
		if hardening.IsWindows(vms[i].OSType) || !vms[i].HasAgent() {
			continue // a Windows guest, or one without an agent: its siblings name it, it names none (vmoptions.go)
		}
		g.Go(func() error {
			if err := m.nameGuest(gctx, vms[i].VMID, vms[i].Name, hostsBlock(vms, i)); err != nil {
				return fmt.Errorf("vm %s: %w", vms[i].Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// nameGuest sets VM vmid's hostname to name and puts block into its
// /etc/hosts (see the design decisions above). Errors name the step and
// the guest call's cause, never what the guest printed.
func (m *Engine) nameGuest(ctx context.Context, vmid int, name string, block []byte) error {
	ctx, cancel := context.WithTimeout(ctx, nameTimeout)
	defer cancel()
	g := m.Guest(vmid)
	res, err := g.Exec(ctx, GuestExec{Argv: []string{"/bin/sh", "-c", hostsRead, namingTag, name, strconv.Itoa(maxHostsFile + 1)},
		Timeout: int64(nameTimeout / time.Second), OutputLimit: maxHostsFile + 1})
	if err != nil {
		return fmt.Errorf("vm %d: set hostname and read /etc/hosts: %s", vmid, guestCause(err))
	}
	// any outcome but a whole read (a symlink, no regular file, too
	// large, a failed read): a fresh file
	existing := []byte(hostsBase)
	switch {
	case res.ExitCode == 5:
		return fmt.Errorf("vm %d: set hostname %s: refused by the guest (exit 5)", vmid, name)
	case res.ExitCode == 0 && !res.StdoutTruncated && len(res.Stdout) <= maxHostsFile:
		existing = res.Stdout
	}
	if err := g.WriteFile(ctx, "/etc/hosts", bytes.NewReader(mergeHosts(existing, block)), 0o644); err != nil {
		return fmt.Errorf("vm %d: write /etc/hosts: %s", vmid, guestCause(err))
	}
	if err := g.WriteFile(ctx, "/etc/hostname", bytes.NewReader([]byte(name+"\n")), 0o644); err != nil {
		return fmt.Errorf("vm %d: write /etc/hostname: %s", vmid, guestCause(err))
	}
	return nil
}

// nameEgress hands rec's VM names and addresses to the Egress's resolver
// (EgressNamer; nothing without one).
func (m *Engine) nameEgress(ctx context.Context, rec *record) error {
	n, ok := m.o.Egress.(EgressNamer)
	if !ok {
		return nil
	}
	m.mu.Lock()
	sb := cloneSandbox(rec.Sandbox)
	m.mu.Unlock()
	if err := n.SetNames(ctx, sb.ID, sb.Zone, egressNames(sb)); err != nil {
		return fmt.Errorf("hand the names to the egress resolver: %w", err)
	}
	return nil
}

// egressNames are sb's VM names, each with its addresses on the bridges
// (vnets) of their networks.
func egressNames(sb apitype.Sandbox) map[string][]NameAddr {
	vnet := map[string]string{}
	for _, n := range sb.Networks {
		vnet[n.Name] = n.VNet
	}
	out := make(map[string][]NameAddr, len(sb.VMs))
	for _, v := range sb.VMs {
		addrs := []NameAddr{}
		for _, a := range v.Addresses {
			ip, err := netip.ParseAddr(a.IPv4)
			if err != nil || vnet[a.Network] == "" {
				continue
			}
			addrs = append(addrs, NameAddr{Bridge: vnet[a.Network], Addr: ip})
		}
		out[v.Name] = addrs
	}
	return out
}
