package sandboxapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Request limits that do not depend on configuration.
const (
	maxJSONBody      = 1 << 20 // create/extend/snapshot/check bodies
	maxExecBody      = 8 << 20 // exec bodies (stdin rides in them)
	maxVMsPerRequest = 64
	maxNetworks      = 10
	maxLabels        = 32
	maxArgv          = 4096
	maxArgBytes      = 1 << 20
	maxEnv           = 1024
	maxPathLen       = 4096
	maxExecTimeout   = 24 * 3600
	maxOutputLimit   = 1 << 30
	// maxCollected caps each stream of an exec whose output is collected
	// and answered in one document; larger limits must stream (NDJSON).
	maxCollected = 64 << 20
	minCores     = apitype.MinVMCores
	maxCores     = apitype.MaxVMCores
	minMemoryMiB = apitype.MinVMMemoryMiB
	maxMemoryMiB = apitype.MaxVMMemoryMiB
	maxDiskGiB   = 64 << 10
	// defaultCores and defaultMemoryMiB are a VM's when it says 0.
	defaultCores     = 1
	defaultMemoryMiB = 1024
	// minCIDRBits and maxCIDRBits bound a network's prefix length.
	minCIDRBits = 16
	maxCIDRBits = 28
	// maxOwnerChars and maxLabelChars bound the owner and a label value
	// (characters, as JSON Schema's maxLength counts).
	maxOwnerChars = 64
	maxLabelChars = 256
	maxUserChars  = 64
)

// reservedHostNames are the names a guest's own /etc/hosts gives the
// loopback and IPv6 multicast addresses (Debian's netbase and
// cloud-init's templates; broadcasthost is macOS's): a VM named so would
// shadow them in its siblings' /etc/hosts (the managed block, names.go)
// or be shadowed.
var reservedHostNames = map[string]bool{"localhost": true, "ip6-localhost": true, "ip6-loopback": true, "ip6-localnet": true,
	"ip6-mcastprefix": true, "ip6-allnodes": true, "ip6-allrouters": true, "ip6-allhosts": true, "broadcasthost": true}

// reservedSnapshot is the one name reSnapshot allows that Proxmox refuses
// (qemu-server API2/Qemu.pm snapshot: "current" is reserved).
const reservedSnapshot = "current"

var (
	reName     = regexp.MustCompile(`^[a-z][a-z0-9-]{0,30}[a-z0-9]$|^[a-z]$`)
	reTemplate = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	reSnapshot = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{1,39}$`)
	reLabelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
	// reMAC is Proxmox's mac-addr format (pve-common JSONSchema.pm
	// pve_verify_mac_addr): six colon-separated hex pairs, any case, the
	// I/G (group) bit clear.
	reMAC = regexp.MustCompile(`^[0-9A-Fa-f][02468ACEace](?::[0-9A-Fa-f]{2}){5}$`)
)

// zeroMAC passes reMAC and names no NIC.
const zeroMAC = "00:00:00:00:00:00"

// invalid builds an invalid-request problem naming the field.
func invalid(field, format string, a ...any) *apitype.Problem {
	p := problemf(apitype.ProblemInvalidRequest, format, a...)
	p.Field = field
	return p
}

// decodeJSON reads one strict JSON document (unknown fields refused, no
// trailing data) of at most max bytes into v.
func decodeJSON(w http.ResponseWriter, r *http.Request, max int64, v any) *apitype.Problem {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return problemf(apitype.ProblemUnsupportedMediaType, "content type %q: want application/json", ct)
		}
	}
	if r.ContentLength > max {
		return problemf(apitype.ProblemPayloadTooLarge, "body of %d bytes is over the limit of %d", r.ContentLength, max)
	}
	return decodeStrict(http.MaxBytesReader(w, r.Body, max), max, v)
}

// decodeStrict is the body decoder shared by the handlers and fuzz tests.
// The body must be a JSON object: a null (which json would take as "leave
// v as it is", an empty request), an array or a scalar is refused.
func decodeStrict(body io.Reader, max int64, v any) *apitype.Problem {
	br := bufio.NewReader(body)
	for {
		b, err := br.ReadByte()
		if err != nil {
			break // the decoder below reports the empty or oversized body
		}
		if b == ' ' || b == '\t' || b == '\n' || b == '\r' {
			continue
		}
		_ = br.UnreadByte()
		if b != '{' {
			return invalid("", "the body must be a JSON object")
		}
		break
	}
	var seen bytes.Buffer // what the decoder read, scanned for nulls after
	dec := json.NewDecoder(io.TeeReader(br, &seen))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return problemf(apitype.ProblemPayloadTooLarge, "body is over the limit of %d bytes", max)
		}
		if errors.Is(err, io.EOF) {
			return invalid("", "empty body: want a JSON object")
		}
		return invalid("", "bad JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return problemf(apitype.ProblemPayloadTooLarge, "body is over the limit of %d bytes", max)
		}
		return invalid("", "trailing data after the JSON object")
	}
	if hasNull(seen.Bytes()) {
		// json leaves a field as it is for null: a null would be taken
		// as the field left out, which the document does not allow
		return invalid("", "null is not a value of any field: leave the field out")
	}
	return nil
}

// hasNull reports whether the JSON document b holds a null value.
func hasNull(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if tok == nil {
			return true
		}
	}
}

// cleanText reports whether s is valid UTF-8 without control characters.
func cleanText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// validateCreate checks a create request and fills defaults. maxTTL bounds
// the TTL; defTTL is used when it is 0.
func validateCreate(c *apitype.CreateRequest, defTTL, maxTTL int64) *apitype.Problem {
	if len(c.VMs) == 0 {
		return invalid("vms", "at least one VM is required")
	}
	if len(c.VMs) > maxVMsPerRequest {
		return invalid("vms", "%d VMs: at most %d per request", len(c.VMs), maxVMsPerRequest)
	}
	if len(c.Networks) > maxNetworks {
		return invalid("networks", "%d networks: at most %d", len(c.Networks), maxNetworks)
	}
	if len(c.Networks) == 0 {
		c.Networks = []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}
	}
	nets := map[string]bool{}
	for i := range c.Networks {
		n := &c.Networks[i]
		f := fmt.Sprintf("networks[%d]", i)
		if !reName.MatchString(n.Name) {
			return invalid(f+".name", "network name %q: want [a-z][a-z0-9-]*, at most 32 characters", n.Name)
		}
		if nets[n.Name] {
			return invalid(f+".name", "network name %q used twice", n.Name)
		}
		nets[n.Name] = true
		if n.CIDR == "" {
			n.CIDR = "auto"
		}
		if n.CIDR != "auto" {
			p, err := netip.ParsePrefix(n.CIDR)
			if err != nil || !p.Addr().Is4() {
				return invalid(f+".cidr", "cidr %q: want an IPv4 prefix or \"auto\"", n.CIDR)
			}
			if p.Masked() != p {
				return invalid(f+".cidr", "cidr %q has host bits set", n.CIDR)
			}
			if p.Bits() < minCIDRBits || p.Bits() > maxCIDRBits {
				return invalid(f+".cidr", "cidr %q: prefix length must be %d..%d", n.CIDR, minCIDRBits, maxCIDRBits)
			}
			if !sandbox.PrivateV4(p) {
				return invalid(f+".cidr", "cidr %q: must be a private (RFC 1918) range", n.CIDR)
			}
		}
		if pr := validateDHCPRanges(n, f); pr != nil {
			return pr
		}
	}
	fixed := nicClaims{macs: map[string]string{}, ips: map[netip.Addr]string{}}
	names := map[string]bool{}
	for i := range c.VMs {
		v := &c.VMs[i]
		f := fmt.Sprintf("vms[%d]", i)
		if v.Name == "" {
			v.Name = fmt.Sprintf("vm%d", i)
		}
		if !reName.MatchString(v.Name) {
			return invalid(f+".name", "VM name %q: want [a-z][a-z0-9-]*, at most 32 characters", v.Name)
		}
		if reservedHostNames[v.Name] {
			return invalid(f+".name", "VM name %q is a name every guest's /etc/hosts gives the loopback or a multicast address: the sandbox's other VMs could not reach it by name, and it would shadow that meaning in theirs", v.Name)
		}
		if names[v.Name] {
			return invalid(f+".name", "VM name %q used twice", v.Name)
		}
		names[v.Name] = true
		switch v.Kind {
		case "", apitype.KindVM:
			v.Kind = ""
		case apitype.KindLXC:
			if v.DiskGiB != 0 {
				return invalid(f+".disk_gib", "disk_gib is not taken for a container (kind lxc): its root file system is its template's size")
			}
			if slices.ContainsFunc(v.NICs, func(n apitype.NIC) bool { return n.MAC != "" || n.IPv4 != "" }) {
				return invalid(f+".nics", "a container (kind lxc) takes no fixed MAC or IPv4 address yet; give its networks only")
			}
		default:
			return invalid(f+".kind", "kind %q: want %q (default) or %q", v.Kind, apitype.KindVM, apitype.KindLXC)
		}
		if !reTemplate.MatchString(v.Template) {
			return invalid(f+".template", "template %q: want a template name", v.Template)
		}
		if pr := validateVMOptions(v, f); pr != nil {
			return pr
		}
		if hardening.IsWindows(v.OSType) && v.HasAgent() && len(c.Env) > 0 {
			return invalid("env", "env is written to %s (a Linux path POSIX shells read) in every VM, and vms[%d] runs Windows (os_type %s); give env to a sandbox of Linux VMs only, or pass env with each exec", apitype.GuestEnvPath, i, v.OSType)
		}
		if v.Cores == 0 {
			v.Cores = defaultCores
		}
		if v.MemoryMiB == 0 {
			v.MemoryMiB = defaultMemoryMiB
		}
		if v.Cores < minCores || v.Cores > maxCores {
			return invalid(f+".cores", "cores %d: want %d..%d", v.Cores, minCores, maxCores)
		}
		if v.MemoryMiB < minMemoryMiB || v.MemoryMiB > maxMemoryMiB {
			return invalid(f+".memory_mib", "memory_mib %d: want %d..%d", v.MemoryMiB, minMemoryMiB, maxMemoryMiB)
		}
		if v.DiskGiB < 0 || v.DiskGiB > maxDiskGiB {
			return invalid(f+".disk_gib", "disk_gib %d: want 0..%d", v.DiskGiB, maxDiskGiB)
		}
		if v.NoNetwork {
			if len(v.Networks) > 0 || len(v.NICs) > 0 {
				return invalid(f+".no_network", "no_network is a VM without any NIC: give no networks or nics with it")
			}
			// never the first network's default below: the engine
			// attaches nothing and deletes the template's NICs
			v.Networks = []string{}
			continue
		}
		if pr := fixed.validateNICs(v, f, c.Networks); pr != nil {
			return pr
		}
		if len(v.Networks) == 0 {
			v.Networks = []string{c.Networks[0].Name}
		}
		if len(v.Networks) > maxNetworks {
			return invalid(f+".networks", "%d NICs: at most %d", len(v.Networks), maxNetworks)
		}
		for _, n := range v.Networks {
			if _, shared := apitype.SharedVNetOf(n); shared && len(v.NICs) > 0 {
				continue // a NIC's vnet (validateNICs); networks take names only
			}
			if !nets[n] {
				return invalid(f+".networks", "network %q is not defined in networks", n)
			}
		}
	}
	if len(c.Env) > 0 && !slices.ContainsFunc(c.VMs, apitype.VMRequest.HasAgent) {
		return invalid("env", "env is written through the guest agent into the VMs that have one, and every VM of this sandbox has agent false; give env to a sandbox with a VM that has an agent, or none")
	}
	if pr := checkRangeRoom(c); pr != nil {
		return pr
	}
	if err := apitype.ValidateEnv(c.Env); err != nil {
		return invalid("env", "%v", err)
	}
	if len(c.Labels) > maxLabels {
		return invalid("labels", "%d labels: at most %d", len(c.Labels), maxLabels)
	}
	for k, v := range c.Labels {
		if !reLabelKey.MatchString(k) {
			return invalid("labels", "label key %q: want [A-Za-z0-9._/-], at most 63 characters", k)
		}
		if utf8.RuneCountInString(v) > maxLabelChars || !cleanText(v) {
			return invalid("labels", "label %q: value must be printable text of at most %d characters", k, maxLabelChars)
		}
	}
	if utf8.RuneCountInString(c.Owner) > maxOwnerChars || !cleanText(c.Owner) {
		return invalid("owner", "owner must be printable text of at most %d characters", maxOwnerChars)
	}
	if c.TTLSeconds == 0 {
		c.TTLSeconds = defTTL
	}
	if c.TTLSeconds < 1 || c.TTLSeconds > maxTTL {
		return invalid("ttl_seconds", "ttl_seconds %d: want 1..%d", c.TTLSeconds, maxTTL)
	}
	return nil
}

// validateVMOptions checks VM v's (field f) firmware, cpu, os_type,
// disk_controller, nic_controller and agent against the values the
// hardened profile takes (hardening/options.go); the defaults written out
// are accepted and kept as given. A container takes none of them (nor
// agent: the daemon enters a container from the node, it has no agent).
func validateVMOptions(v *apitype.VMRequest, f string) *apitype.Problem {
	if v.Kind == apitype.KindLXC {
		for _, o := range []struct{ field, val string }{{"firmware", v.Firmware}, {"cpu", v.CPU}, {"os_type", v.OSType}, {"disk_controller", v.DiskController}, {"nic_controller", v.NICController}} {
			if o.val != "" {
				return invalid(f+"."+o.field, "%s is a VM's option: a container (kind lxc) takes none", o.field)
			}
		}
		if v.Agent != nil {
			return invalid(f+".agent", "agent is a VM's option: a container (kind lxc) has no guest agent, the daemon enters it from the node")
		}
		return nil
	}
	switch v.Firmware {
	case "", hardening.FirmwareSeaBIOS, hardening.FirmwareUEFI:
	default:
		return invalid(f+".firmware", "firmware %q: want %q (default) or %q", v.Firmware, hardening.FirmwareSeaBIOS, hardening.FirmwareUEFI)
	}
	if v.CPU != "" && !slices.Contains(hardening.CPUModels, v.CPU) {
		return invalid(f+".cpu", "cpu %q: want one of %s (flags and custom models are not taken: nested virtualization stays off)", v.CPU, strings.Join(hardening.CPUModels, ", "))
	}
	if v.OSType != "" && !slices.Contains(hardening.OSTypes, v.OSType) {
		return invalid(f+".os_type", "os_type %q: want one of %s (other types keep HPET on, or are releases out of support)", v.OSType, strings.Join(hardening.OSTypes, ", "))
	}
	switch v.DiskController {
	case "", hardening.DiskSCSI, hardening.DiskIDE:
	default:
		return invalid(f+".disk_controller", "disk_controller %q: want %q or %q (the bus the template's disks are on; a clone keeps them)", v.DiskController, hardening.DiskSCSI, hardening.DiskIDE)
	}
	switch v.NICController {
	case "", hardening.NICVirtio, hardening.NICE1000:
	default:
		return invalid(f+".nic_controller", "nic_controller %q: want %q (default) or %q", v.NICController, hardening.NICVirtio, hardening.NICE1000)
	}
	return nil
}

// nicClaims are the MACs and fixed addresses of a create's NICs so far,
// each with the field that took it.
type nicClaims struct {
	macs map[string]string
	ips  map[netip.Addr]string
}

// validateNICs checks the nics of VM v (field f) against the sandbox's
// networks (validated, CIDRs filled) and the NICs before it, upper-cases
// their MACs, and sets v.Networks from them.
func (cl nicClaims) validateNICs(v *apitype.VMRequest, f string, nets []apitype.NetworkRequest) *apitype.Problem {
	if len(v.NICs) == 0 {
		return nil
	}
	if len(v.Networks) > 0 {
		return invalid(f+".nics", "give networks or nics, not both")
	}
	if len(v.NICs) > maxNetworks {
		return invalid(f+".nics", "%d NICs: at most %d", len(v.NICs), maxNetworks)
	}
	v.Networks = make([]string, len(v.NICs))
	for j := range v.NICs {
		n := &v.NICs[j]
		nf := fmt.Sprintf("%s.nics[%d]", f, j)
		if n.VNet != "" {
			if pr := validateSharedNIC(n, nf); pr != nil {
				return pr
			}
			v.Networks[j] = apitype.SharedNetwork(n.VNet)
			continue
		}
		k := slices.IndexFunc(nets, func(w apitype.NetworkRequest) bool { return w.Name == n.Network })
		if k < 0 {
			return invalid(nf+".network", "network %q is not defined in networks", n.Network)
		}
		v.Networks[j] = n.Network
		if n.MAC != "" {
			if !reMAC.MatchString(n.MAC) || n.MAC == zeroMAC {
				return invalid(nf+".mac", "mac %q: want a unicast MAC address XX:XX:XX:XX:XX:XX (the group bit of the first octet clear), not all zeros", n.MAC)
			}
			n.MAC = strings.ToUpper(n.MAC)
			if other, ok := cl.macs[n.MAC]; ok {
				return invalid(nf+".mac", "mac %s is %s's too: a MAC is unique in the sandbox", n.MAC, other)
			}
			cl.macs[n.MAC] = nf
		}
		if n.IPv4 == "" {
			continue
		}
		ip, err := netip.ParseAddr(n.IPv4)
		if err != nil || !ip.Is4() {
			return invalid(nf+".ipv4", "ipv4 %q: want an IPv4 address", n.IPv4)
		}
		net := nets[k]
		if net.CIDR == "auto" {
			return invalid(nf+".ipv4", "network %q has cidr \"auto\": a fixed address needs a network with a fixed cidr", net.Name)
		}
		// dhcp off takes one too: such a network is a subnet without a
		// dhcp-range in a zone with DHCP, and a start maps the MAC's IPAM
		// address all the same (pve-network Vnets.pm add_dhcp_mapping,
		// Dhcp.pm add_mapping), which the zone's dnsmasq serves through
		// the subnet's static range (Dhcp/Dnsmasq.pm configure_subnet).
		if why := sandbox.FixedAddressRefusal(netip.MustParsePrefix(net.CIDR), ip); why != "" {
			return invalid(nf+".ipv4", "ipv4 %s on network %q: %s", ip, net.Name, why)
		}
		if other, ok := cl.ips[ip]; ok {
			return invalid(nf+".ipv4", "ipv4 %s is %s's too: an address is unique in the sandbox", ip, other)
		}
		cl.ips[ip] = nf
	}
	return nil
}

// maxVNetChars bounds a NIC's vnet: a Proxmox vnet alias is at most 256
// characters (pve-network VnetPlugin.pm properties, alias maxLength).
const maxVNetChars = 256

// validateSharedNIC checks a NIC (field nf) that names a shared vnet: a
// vnet id or alias as text, neither network nor a fixed MAC or address
// beside it. Whether the node shares it is the engine's to say (it asks
// Proxmox: sandbox sharedvnets.go).
func validateSharedNIC(n *apitype.NIC, nf string) *apitype.Problem {
	if n.Network != "" {
		return invalid(nf+".network", "give network or vnet, not both")
	}
	if utf8.RuneCountInString(n.VNet) > maxVNetChars || !cleanText(n.VNet) || strings.TrimSpace(n.VNet) != n.VNet {
		return invalid(nf+".vnet", "vnet must be a vnet id or alias: printable text of at most %d characters, no leading or trailing space", maxVNetChars)
	}
	if n.MAC != "" {
		return invalid(nf+".mac", "a NIC on a shared vnet takes no fixed MAC: the vnet's other guests belong to other sandboxes, and a MAC is unique only in a sandbox")
	}
	if n.IPv4 != "" {
		return invalid(nf+".ipv4", "a NIC on a shared vnet takes no fixed address: the vnet's subnet and IPAM are the operator's, not the sandbox's")
	}
	return nil
}

// validateExtend checks an extend request.
func validateExtend(e *apitype.ExtendRequest, maxTTL int64) *apitype.Problem {
	if e.TTLSeconds < 1 || e.TTLSeconds > maxTTL {
		return invalid("ttl_seconds", "ttl_seconds %d: want 1..%d", e.TTLSeconds, maxTTL)
	}
	return nil
}

// validateExec checks an exec request; win: the VM runs Windows (cwd is
// a Windows path).
func validateExec(e *apitype.ExecRequest, win bool) *apitype.Problem {
	if len(e.Argv) == 0 {
		return invalid("argv", "argv must not be empty")
	}
	if len(e.Argv) > maxArgv {
		return invalid("argv", "%d arguments: at most %d", len(e.Argv), maxArgv)
	}
	total := 0
	for i, a := range e.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid(fmt.Sprintf("argv[%d]", i), "argument contains a NUL byte")
		}
		total += len(a)
	}
	if e.Argv[0] == "" {
		return invalid("argv[0]", "program must not be empty")
	}
	if total > maxArgBytes {
		return invalid("argv", "arguments total %d bytes: at most %d", total, maxArgBytes)
	}
	if strings.IndexByte(e.Cwd, 0) >= 0 || len(e.Cwd) > maxPathLen {
		return invalid("cwd", "cwd contains a NUL byte or is too long")
	}
	switch {
	case e.Cwd != "" && win:
		if pr := validateWinPath("cwd", e.Cwd); pr != nil {
			return pr
		}
	case e.Cwd != "" && !strings.HasPrefix(e.Cwd, "/"):
		return invalid("cwd", "cwd %q must be absolute", e.Cwd)
	}
	if len(e.Env) > maxEnv {
		return invalid("env", "%d variables: at most %d", len(e.Env), maxEnv)
	}
	for k, v := range e.Env {
		// the guest agent client takes identifiers only (qga: an env name
		// not one is invalid; schemathesis ST202 on exec)
		if !apitype.ValidEnvName(k) || strings.IndexByte(v, 0) >= 0 {
			return invalid("env", "variable %q: names of letters, digits and _ (not starting with a digit), values without NUL", k)
		}
	}
	if e.User != "" && (utf8.RuneCountInString(e.User) > maxUserChars || !cleanText(e.User) || strings.ContainsAny(e.User, " :/")) {
		return invalid("user", "user %q is not a user name", e.User)
	}
	if e.TimeoutSeconds < 0 || e.TimeoutSeconds > maxExecTimeout {
		return invalid("timeout_seconds", "timeout_seconds %d: want 0..%d", e.TimeoutSeconds, maxExecTimeout)
	}
	if e.OutputLimit < 0 || e.OutputLimit > maxOutputLimit {
		return invalid("output_limit", "output_limit %d: want 0..%d", e.OutputLimit, maxOutputLimit)
	}
	return nil
}

// guestPath is the guest file path of ?path= as the guest is handed it:
// validated (validateGuestPath), then cleaned lexically (path.Clean), since
// the guest agent client takes clean paths only (qga checkGuestPath: an
// unclean one is invalid), and the document allows any absolute path
// (schemathesis ST202 on PUT files: "/a//b" or "/a/" answered 400). A write
// to a path whose last element is empty, "." or ".." (a directory, as the
// kernel's open with O_CREAT says: EISDIR) is is-a-directory.
//
// A Windows VM's path (win) is a drive-absolute Windows path, handed on
// as given: its guest client cleans and checks it (qga.CleanWinPath) and
// refuses what it cannot take as invalid.
func guestPath(p string, write, win bool) (string, *apitype.Problem) {
	if win {
		return p, validateWinPath("path", p)
	}
	if pr := validateGuestPath(p); pr != nil {
		return "", pr
	}
	if last := p[strings.LastIndexByte(p, '/')+1:]; write && (last == "" || last == "." || last == "..") {
		return "", problemf(apitype.ProblemIsDirectory, "path %q names a directory: a file cannot be written there", p)
	}
	return path.Clean(p), nil
}

// validateWinPath checks a Windows VM's path (field f): present, no NUL,
// not too long, UTF-8 and drive-absolute (C:\dir or C:/dir).
func validateWinPath(f, p string) *apitype.Problem {
	switch {
	case p == "":
		return invalid(f, "%s is required", f)
	case strings.IndexByte(p, 0) >= 0:
		return invalid(f, "%s contains a NUL byte", f)
	case len(p) > maxPathLen:
		return invalid(f, "%s is longer than %d bytes", f, maxPathLen)
	case !utf8.ValidString(p):
		return invalid(f, "%s is not valid UTF-8", f)
	case !driveAbsolute(p):
		return invalid(f, "%s %q: the VM runs Windows, so it must be a drive-absolute Windows path (C:\\dir\\file)", f, p)
	}
	return nil
}

// driveAbsolute reports whether p starts like a Windows drive-absolute
// path: a letter, ':' and a separator.
func driveAbsolute(p string) bool {
	return len(p) >= 3 && (p[0]|0x20 >= 'a' && p[0]|0x20 <= 'z') && p[1] == ':' && (p[2] == '\\' || p[2] == '/')
}

// validateGuestPath checks a guest file path from ?path=.
func validateGuestPath(p string) *apitype.Problem {
	switch {
	case p == "":
		return invalid("path", "query parameter path is required")
	case strings.IndexByte(p, 0) >= 0:
		return invalid("path", "path contains a NUL byte")
	case len(p) > maxPathLen:
		return invalid("path", "path is longer than %d bytes", maxPathLen)
	case !strings.HasPrefix(p, "/"):
		return invalid("path", "path %q must be absolute", p)
	case !utf8.ValidString(p):
		return invalid("path", "path is not valid UTF-8")
	}
	return nil
}

// validateSnapshotName checks a snapshot name (Proxmox's pve-configid rules).
func validateSnapshotName(n string) *apitype.Problem {
	if n == reservedSnapshot {
		return invalid("name", "snapshot name %q is reserved by Proxmox (the VM's present state)", n)
	}
	if !reSnapshot.MatchString(n) {
		return invalid("name", "snapshot name %q: want [A-Za-z][A-Za-z0-9_-]{1,39}", n)
	}
	return nil
}
