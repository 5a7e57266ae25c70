package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
)

// racingProxmox is the fake node with another node's daemon in the same
// cluster: the first subnet this daemon creates is created at the same
// moment by the other daemon, on a vnet of its own sandbox (racerVNet),
// so the cluster's subnets have that range twice from then on.
type racingProxmox struct {
	*apitest.Proxmox
	mu    sync.Mutex
	taken string
}

// racerVNet is the other daemon's vnet of racingProxmox.
var racerVNet = sandbox.VNetInfo{ID: "vracer10", Zone: "sbracer1", Alias: "pvei-n-node2 pvei-s-sbracer1"}

func (r *racingProxmox) CreateSubnet(ctx context.Context, s sandbox.SubnetSpec) error {
	r.mu.Lock()
	if r.taken == "" {
		r.taken = s.CIDR
	}
	r.mu.Unlock()
	return r.Proxmox.CreateSubnet(ctx, s)
}

func (r *racingProxmox) ListVNets(ctx context.Context) ([]sandbox.VNetInfo, error) {
	vs, err := r.Proxmox.ListVNets(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.taken != "" {
		vs = append(vs, racerVNet)
	}
	return vs, err
}

func (r *racingProxmox) VNetSubnets(ctx context.Context, vnet string) ([]string, error) {
	if vnet == racerVNet.ID {
		r.mu.Lock()
		defer r.mu.Unlock()
		return []string{r.taken}, nil
	}
	return r.Proxmox.VNetSubnets(ctx, vnet)
}

// TestSubnetRaceBacksOff: a range another node's daemon took at the same
// time is given up: an "auto" network gets another one, an explicit one is
// a conflict, and neither leaves its subnet behind.
func TestSubnetRaceBacksOff(t *testing.T) {
	cases := []struct {
		name string
		cidr string
	}{{"auto", "auto"}, {"explicit", "10.77.0.0/24"}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			g := apitest.NewGuests()
			px := &racingProxmox{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000})}
			e, err := sandbox.New(sandbox.Options{Node: "node1", Proxmox: px, Guests: g.Dial, StateDir: t.TempDir(), AgentTimeout: 2 * time.Second,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			req := oneVM("debian")
			req.Networks[0].CIDR = tc.cidr
			sb, err := e.Create(ctx, req)
			if tc.cidr == "auto" {
				if err != nil {
					t.Fatal(err)
				}
				if sb.Networks[0].CIDR == px.taken {
					t.Fatalf("kept the contested range %s", px.taken)
				}
				if cs := px.Subnets[sb.Networks[0].VNet]; len(cs) != 1 || cs[0] != sb.Networks[0].CIDR {
					t.Fatalf("subnets of the vnet: %v, want only %s", cs, sb.Networks[0].CIDR)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrConflict) {
				t.Fatalf("explicit contested range: %v", err)
			}
			for vn, cs := range px.Subnets {
				if len(cs) != 0 {
					t.Errorf("subnets left on %s: %v", vn, cs)
				}
			}
			if list := e.List(); len(list) != 0 {
				t.Errorf("sandboxes left: %v", list)
			}
		})
	}
}

// TestContestedRangeMovesToANewVNet: the vnet that had a contested range
// goes with it, and the next range is on a vnet of a new name, in the
// sandbox's zone, with its tags; the VM is on that vnet, and the delete
// leaves neither vnet nor zone.
func TestContestedRangeMovesToANewVNet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := apitest.NewGuests()
	px := &racingProxmox{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000})}
	e, err := sandbox.New(sandbox.Options{Node: "node1", Proxmox: px, Guests: g.Dial, StateDir: t.TempDir(), AgentTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	first, moved := "v"+sb.ID[2:]+"0", sb.Networks[0].VNet
	vnets, err := px.Proxmox.ListVNets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vnets {
		names = append(names, v.ID)
		if v.ID == moved && (v.Zone != sb.ID || !strings.Contains(v.Alias, sb.ID)) {
			t.Errorf("the new vnet: %+v, want one in zone %s with the sandbox's tags", v, sb.ID)
		}
	}
	if moved == first || !slices.Equal(names, []string{moved}) {
		t.Errorf("vnets %v (the sandbox's: %s): want only a vnet other than %s, which had the contested range", names, moved, first)
	}
	if vm, _ := px.VMByID(sb.VMs[0].VMID); !slices.Equal(vm.Config.Bridges, []string{moved}) {
		t.Errorf("the VM's bridges: %v, want [%s]", vm.Config.Bridges, moved)
	}
	if err := e.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if vnets, err := px.Proxmox.ListVNets(ctx); err != nil || len(vnets) != 0 {
		t.Errorf("vnets left after the delete: %v (%v)", vnets, err)
	}
}
