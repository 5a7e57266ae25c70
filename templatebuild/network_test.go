package templatebuild

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

// TestBuildNetwork: with no --bridge the build VM's NIC is on the build
// network the build makes (a zone, a vnet, a subnet with SNAT and DHCP,
// applied before the create) and a second build reuses it; a --bridge
// the guard treats as management or trusted is refused unless
// --unguarded-bridge.
func TestBuildNetwork(t *testing.T) {
	w := newWorld()
	build := func(o Options) error {
		b, err := New(w.pve, w.agent, w.host, o)
		if err != nil {
			return err
		}
		_, err = b.Run(context.Background())
		return err
	}
	base := Options{Name: "t1", Recipe: Recipes()["debian13"], Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
		AgentPoll: 1, Progress: &bytes.Buffer{}, Protected: []string{"vmbr0", "eth9"}}
	if err := build(base); err != nil {
		t.Fatal(err)
	}
	if len(w.pve.created) != 1 || w.pve.created[0]["net0"] != "virtio,bridge="+BuildVNet {
		t.Fatalf("creates %v: want net0 on %s", w.pve.created, BuildVNet)
	}
	for _, want := range []string{"zone " + BuildZone, "vnet " + BuildVNet + " " + BuildZone, "subnet " + BuildVNet + " 10.254.254.0/24 snat=true dhcp=10.254.254.2-10.254.254.254"} {
		if !slices.Contains(w.pve.calls, want) {
			t.Errorf("calls %v: want %q", w.pve.calls, want)
		}
	}
	if a, c := slices.Index(w.pve.calls, "apply sdn"), slices.IndexFunc(w.pve.calls, func(c string) bool { return strings.HasPrefix(c, "create ") }); a < 0 || a > c {
		t.Errorf("calls %v: want the SDN apply before the create", w.pve.calls)
	}
	// A second build (another name) reuses the network.
	w.pve.calls = nil
	o := base
	o.Name = "t2"
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(w.pve.calls, func(c string) bool { return strings.HasPrefix(c, "subnet ") || strings.HasPrefix(c, "vnet ") }) {
		t.Errorf("second build remade the network: %v", w.pve.calls)
	}
	if w.pve.created[1]["net0"] != "virtio,bridge="+BuildVNet {
		t.Errorf("second build's net0 %q", w.pve.created[1]["net0"])
	}
	// A management bridge is refused, unless opted in.
	for _, br := range []string{"vmbr0", "eth9"} {
		o := base
		o.Name, o.Bridge = "t3", br
		if err := build(o); err == nil || !strings.Contains(err.Error(), "--unguarded-bridge") {
			t.Errorf("--bridge %s: %v, want refused", br, err)
		}
	}
	o.Name, o.Bridge, o.Unguarded = "t3", "vmbr0", true
	if err := build(o); err != nil {
		t.Fatalf("--bridge vmbr0 --unguarded-bridge: %v", err)
	}
	if got := w.pve.created[len(w.pve.created)-1]["net0"]; got != "virtio,bridge=vmbr0" {
		t.Errorf("opted-in build's net0 %q", got)
	}
	// A vnet of the build network's name in another zone is not the build's.
	w2 := newWorld()
	w2.pve.vnets[BuildVNet] = "other"
	b, err := New(w2.pve, w2.agent, w2.host, base)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "not the build network's zone") {
		t.Errorf("foreign vnet %s: %v", BuildVNet, err)
	}
}
