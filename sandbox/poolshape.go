package sandbox

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// PoolShape is one shape of the warm pool: the one-member sandbox its
// members are, how many to keep ready and for how long. The member is a
// QEMU VM or, with Kind "lxc", an unprivileged container: either is made
// by the code of a cold create of the same request (buildVM), so a
// member is cloned, configured, checked and started exactly as that
// create's member would be.
type PoolShape struct {
	// Name names the shape (metrics, listings): [a-z][a-z0-9-]*.
	Name string `json:"name"`
	// Kind is the member's kind: "vm" (default) or "lxc" (a container,
	// cloned from a container template; the engine must make containers,
	// Options.Containers and CTGuests). A shape has no field a container
	// does not take (no disk size, no fixed NIC), so the other fields
	// mean the same for both kinds.
	Kind string `json:"kind"`
	// Template, Cores and MemoryMiB are the member's (as a create's
	// VMRequest; defaults 1 core, 1024 MiB). Template names a VM template
	// for kind vm, a container template for kind lxc.
	Template  string `json:"template"`
	Cores     int    `json:"cores"`
	MemoryMiB int    `json:"memory_mib"`
	// Networks are the member's network names, each "auto" with DHCP and
	// SNAT on, its VM attached to all of them in order (default ["net0"]).
	Networks []string `json:"networks"`
	// Egress is the policy kind a claim may ask for: "open" (default; a
	// request without an egress object), "none" or "allowlist". The
	// member itself waits with "none"; the claim puts the request's policy
	// in force.
	Egress string `json:"egress"`
	// Target is how many members to keep.
	Target int `json:"target"`
	// MaxAge retires a member this long after it became ready (0: never).
	MaxAge time.Duration `json:"max_age"`
}

var reShapeName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// normalize fills the defaults.
func (s *PoolShape) normalize() {
	if s.Kind == "" {
		s.Kind = apitype.KindVM
	}
	if s.Cores == 0 {
		s.Cores = 1
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = 1024
	}
	if len(s.Networks) == 0 {
		s.Networks = []string{"net0"}
	}
	if s.Egress == "" {
		s.Egress = "open"
	}
}

// ValidateShapes returns the shapes with their defaults filled in, or the
// first one's error (the configuration's check, and New's).
func ValidateShapes(shapes []PoolShape) ([]PoolShape, error) {
	out := slices.Clone(shapes)
	for i := range out {
		out[i].Networks = slices.Clone(out[i].Networks)
	}
	return out, validateShapes(out)
}

// validateShapes fills the shapes' defaults and checks them; two shapes
// that would match the same request are refused.
func validateShapes(shapes []PoolShape) error {
	seen := map[string]bool{}
	keys := map[string]string{}
	for i := range shapes {
		s := &shapes[i]
		s.normalize()
		bad := func(f string, a ...any) error {
			return fmt.Errorf("sandbox: pool shape %q: %s", s.Name, fmt.Sprintf(f, a...))
		}
		switch {
		case !reShapeName.MatchString(s.Name):
			return fmt.Errorf("sandbox: pool shape name %q: want [a-z][a-z0-9-]*, at most 32 characters", s.Name)
		case seen[s.Name]:
			return bad("name used twice")
		case s.Kind != apitype.KindVM && s.Kind != apitype.KindLXC:
			return bad("kind %q: want %q (default) or %q", s.Kind, apitype.KindVM, apitype.KindLXC)
		case s.Template == "":
			return bad("no template")
		case s.Cores < 0 || s.MemoryMiB < 0:
			return bad("cores and memory must be positive")
		case s.Target < 0:
			return bad("target %d is negative", s.Target)
		case s.MaxAge < 0:
			return bad("max age %s is negative", s.MaxAge)
		case !slices.Contains([]string{"open", "none", "allowlist"}, s.Egress):
			return bad("egress %q: want open, none or allowlist", s.Egress)
		}
		nets := map[string]bool{}
		for _, n := range s.Networks {
			if !reShapeName.MatchString(n) || nets[n] {
				return bad("network name %q: want [a-z][a-z0-9-]*, each once", n)
			}
			nets[n] = true
		}
		seen[s.Name] = true
		key := fmt.Sprintf("%s/%s/%d/%d/%s/%s", s.Kind, s.Template, s.Cores, s.MemoryMiB, strings.Join(s.Networks, ","), s.Egress)
		if other, ok := keys[key]; ok {
			return bad("matches the same requests as shape %q", other)
		}
		keys[key] = s.Name
	}
	return nil
}

// memberKind is the kind a member of s has in its record (VMRequest.Kind
// as the API leaves it: "" for a VM, "lxc" for a container).
func (s PoolShape) memberKind() string {
	if s.Kind == apitype.KindLXC {
		return apitype.KindLXC
	}
	return ""
}

// request is the create request a member of s is built from.
func (s PoolShape) request() apitype.CreateRequest {
	req := apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "vm0", Kind: s.memberKind(), Template: s.Template, Cores: s.Cores, MemoryMiB: s.MemoryMiB,
		Networks: slices.Clone(s.Networks)}}}
	for _, n := range s.Networks {
		req.Networks = append(req.Networks, apitype.NetworkRequest{Name: n, CIDR: "auto"})
	}
	return req
}

// matches reports whether req asks for exactly a member of s: one member
// of the shape's kind (a VM for kind vm, a container for kind lxc) of
// the template, cores and memory, no disk resize, the shape's networks by
// name with "auto" ranges, DHCP (of the plan's range: a member's subnet
// was made with it) and SNAT on, the VM on all of them with no
// NIC's MAC or address fixed (a member's NICs are configured already:
// fixed.go; a VM of no_network has none), and an egress policy of the
// shape's kind. Defaults are those of the API's create (sandboxapi fills
// them before the engine sees the request).
func (s PoolShape) matches(req apitype.CreateRequest) bool {
	if len(req.VMs) != 1 || fixesNICs(req) || usesSharedVNets(req) {
		return false
	}
	v := req.VMs[0]
	if hasVMOptions(v) {
		return false // a member's hardware is configured already (vmoptions.go)
	}
	if v.NoNetwork {
		return false // a member's NICs are configured already, on its networks
	}
	if (v.Kind == apitype.KindLXC) != (s.Kind == apitype.KindLXC) {
		return false // a container's request never claims a VM, nor a VM's a container
	}
	if v.Template != s.Template || orDefault(v.Cores, 1) != s.Cores || orDefault(v.MemoryMiB, 1024) != s.MemoryMiB || v.DiskGiB != 0 {
		return false
	}
	nets := req.Networks
	if len(nets) == 0 {
		nets = []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}
	}
	if len(nets) != len(s.Networks) {
		return false
	}
	for i, n := range nets {
		if n.Name != s.Networks[i] || (n.CIDR != "" && n.CIDR != "auto") || (n.DHCP != nil && !*n.DHCP) || (n.SNAT != nil && !*n.SNAT) || len(n.DHCPRanges) > 0 {
			return false
		}
	}
	vnets := v.Networks
	if len(vnets) == 0 {
		vnets = []string{nets[0].Name}
	}
	if !slices.Equal(vnets, s.Networks) {
		return false
	}
	mode := "open"
	if req.Egress != nil {
		mode = req.Egress.Mode
	}
	return mode == s.Egress
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}
