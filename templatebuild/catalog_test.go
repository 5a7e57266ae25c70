package templatebuild_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// listing is a node's VM list for a Catalog: it counts the looks and may
// fail or hold them.
type listing struct {
	mu   sync.Mutex
	vms  []sandbox.VMInfo
	err  error
	hold chan struct{} // when set, each look waits for it to close
	n    atomic.Int32
}

func (l *listing) list(ctx context.Context) ([]sandbox.VMInfo, error) {
	l.n.Add(1)
	l.mu.Lock()
	hold, vms, err := l.hold, append([]sandbox.VMInfo(nil), l.vms...), l.err
	l.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return vms, err
}

// sha256Hex is the hex sha256 of s.

var buildTags = []string{templatebuild.TagInspect, templatebuild.TagTemplate}

// TestCatalogSaysWhatACreateClones: a name is the VM a create of it
// clones (the configured VMID of a pinned name, else the template of the
// name with the lowest VMID), built when the ledger records that VM as a
// template sealed under its own name and the VM is still as the build
// left it, with the image the ledger records; a VM that is no template,
// or a name no template has, is not in it.
func TestCatalogSaysWhatACreateClones(t *testing.T) {
	host := templatebuild.NodeHost{StateDir: filepath.Join(t.TempDir(), "ledger")}
	img := "sha256:" + sha256Hex([]byte("box"))
	for vmid, r := range map[int]templatebuild.Record{
		9100: {Name: "box", State: templatebuild.StateTemplate, Image: img},
		9101: {Name: "box", State: templatebuild.StateTemplate, Image: "sha256:" + sha256Hex([]byte("later"))},
		9200: {Name: "old", State: templatebuild.StateTemplate},
		9300: {Name: "other-name", State: templatebuild.StateTemplate, Image: img},
		9400: {Name: "pooled", State: templatebuild.StateTemplate, Image: img},
		9500: {Name: "half", State: templatebuild.StateBuilding},
		9600: {Name: "plain", State: templatebuild.StateTemplate, Image: img},
	} {
		if err := host.Record(vmid, r); err != nil {
			t.Fatal(err)
		}
	}
	l := &listing{vms: []sandbox.VMInfo{
		{VMID: 9101, Name: "box", Template: true, Tags: buildTags},
		{VMID: 9100, Name: "box", Template: true, Tags: buildTags},
		{VMID: 9200, Name: "old", Template: true, Tags: buildTags},
		{VMID: 9300, Name: "renamed", Template: true, Tags: buildTags},
		{VMID: 9400, Name: "pooled", Template: true, Tags: buildTags, Pool: "sbx"},
		{VMID: 9500, Name: "half", Template: true, Tags: append([]string{templatebuild.TagBuilding}, buildTags...)},
		{VMID: 9600, Name: "plain", Template: true},
		{VMID: 9000, Name: "debian", Template: true},
		{VMID: 9050, Name: "debian13", Template: true, Tags: buildTags},
		{VMID: 100, Name: "running", Status: "running"},
	}}
	cat, err := templatebuild.NewCatalog(templatebuild.CatalogOptions{List: l.list, Ledger: host, Pinned: map[string]int{"debian": 9001, "tmpl": 9100}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		want apitype.TemplateInfo
		ok   bool
	}{
		{"box", apitype.TemplateInfo{Name: "box", VMID: 9100, Built: true, Image: img}, true},
		{"old", apitype.TemplateInfo{Name: "old", VMID: 9200, Built: true}, true},
		{"renamed", apitype.TemplateInfo{Name: "renamed", VMID: 9300}, true},
		{"pooled", apitype.TemplateInfo{Name: "pooled", VMID: 9400}, true},
		{"half", apitype.TemplateInfo{Name: "half", VMID: 9500}, true},
		{"plain", apitype.TemplateInfo{Name: "plain", VMID: 9600}, true},
		{"debian13", apitype.TemplateInfo{Name: "debian13", VMID: 9050}, true},
		// pinned: the configured VM, even one the list does not show; one
		// a build made under its own name is the build's
		{"debian", apitype.TemplateInfo{Name: "debian", VMID: 9001}, true},
		{"tmpl", apitype.TemplateInfo{Name: "tmpl", VMID: 9100, Built: true, Image: img}, true},
		{"running", apitype.TemplateInfo{}, false},
		{"none", apitype.TemplateInfo{}, false},
	} {
		got, ok, err := cat.Template(ctx, tc.name)
		if err != nil || ok != tc.ok || got != tc.want {
			t.Errorf("%s: %+v %v %v, want %+v %v", tc.name, got, ok, err, tc.want, tc.ok)
		}
	}
	if n := l.n.Load(); n != 1 {
		t.Errorf("%d looks at the node for every question within MaxAge, want 1", n)
	}
}

// heldCatalog is a catalog (MaxAge 10 s on clock) over a node with one
// template, debian (VM 9000), whose looks wait for l.hold to close.
func heldCatalog(t *testing.T) (*templatebuild.Catalog, *listing, *testkit.Clock) {
	t.Helper()
	host := templatebuild.NodeHost{StateDir: filepath.Join(t.TempDir(), "ledger")}
	l := &listing{vms: []sandbox.VMInfo{{VMID: 9000, Name: "debian", Template: true}}, hold: make(chan struct{})}
	clock := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cat, err := templatebuild.NewCatalog(templatebuild.CatalogOptions{List: l.list, Ledger: host, MaxAge: 10 * time.Second, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return cat, l, clock
}

// TestCatalogLooksOncePerMaxAge: however many questions come, at once or
// one after another, the node is listed once per MaxAge (a failed look is
// the answer as long); Forget makes the next question look again, and a
// question whose context has ended makes none.
func TestCatalogLooksOncePerMaxAge(t *testing.T) {
	cat, l, clock := heldCatalog(t)
	ctx := context.Background()

	// 20 callers at once while the first look is held: one look
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := cat.Template(ctx, "debian"); err != nil || !ok {
				errs <- errors.Join(err, errors.New("debian not found"))
			}
		}()
	}
	for l.n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(l.hold)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for range 100 {
		if _, _, err := cat.Template(ctx, "random-name"); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.n.Load(); n != 1 {
		t.Fatalf("%d looks for 120 questions within MaxAge, want 1", n)
	}

	// past MaxAge: one more; a failed look is the answer as long
	clock.Advance(11 * time.Second)
	l.mu.Lock()
	l.err = errors.New("proxmox down")
	l.mu.Unlock()
	for range 10 {
		if _, _, err := cat.Template(ctx, "debian"); err == nil {
			t.Fatal("a failed look answered")
		}
	}
	if n := l.n.Load(); n != 2 {
		t.Fatalf("%d looks after MaxAge with the node failing, want 2", n)
	}

	// Forget: the next question looks again, and sees what came
	l.mu.Lock()
	l.err = nil
	l.vms = append(l.vms, sandbox.VMInfo{VMID: 9100, Name: "new", Template: true})
	l.mu.Unlock()
	cat.Forget()
	if got, ok, err := cat.Template(ctx, "new"); err != nil || !ok || got.VMID != 9100 {
		t.Errorf("after Forget: %+v %v %v, want VM 9100", got, ok, err)
	}
	if n := l.n.Load(); n != 3 {
		t.Fatalf("%d looks after Forget, want 3", n)
	}

	// a question whose context has ended is its end, and no look
	// (TestCatalogLookOutlivesItsCaller: one that ends mid-look)
	cat.Forget()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := cat.Template(cctx, "debian"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a question whose context ended: %v", err)
	}
	if _, ok, err := cat.Template(ctx, "debian"); err != nil || !ok {
		t.Errorf("after a cancelled question: %v %v", ok, err)
	}
	if n := l.n.Load(); n != 4 {
		t.Errorf("%d looks, want 4 (none for the cancelled question)", n)
	}
}

// TestCatalogLookOutlivesItsCaller: a look is not its first caller's: a
// caller that leaves while the node is asked (a client that closes its
// connection) does not end the look, and its answer is kept for every
// later question, so a client that asks and hangs up at once cannot make
// the node be listed once per request.
func TestCatalogLookOutlivesItsCaller(t *testing.T) {
	cat, l, _ := heldCatalog(t)
	for i := range 5 {
		cctx, cancel := context.WithCancel(context.Background())
		left := make(chan error, 1)
		go func() {
			_, _, err := cat.Template(cctx, "debian")
			left <- err
		}()
		for l.n.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Fatalf("caller %d that left: %v, want its context's end", i, err)
		}
	}
	close(l.hold)
	if got, ok, err := cat.Template(context.Background(), "debian"); err != nil || !ok || got.VMID != 9000 {
		t.Errorf("after callers left: %+v %v %v, want VM 9000", got, ok, err)
	}
	if n := l.n.Load(); n != 1 {
		t.Errorf("%d looks for 6 questions within MaxAge, 5 of whose callers left: want 1", n)
	}
}

// TestCatalogOneBadRecordFailsOnlyItsName: a ledger record that cannot be
// read fails the question of the name whose template it is, not every
// other name's (each tenant asking of its own template keeps its
// answer).
func TestCatalogOneBadRecordFailsOnlyItsName(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	host := templatebuild.NodeHost{StateDir: dir}
	img := "sha256:" + sha256Hex([]byte("box"))
	if err := host.Record(9100, templatebuild.Record{Name: "box", State: templatebuild.StateTemplate, Image: img}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "9200.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &listing{vms: []sandbox.VMInfo{
		{VMID: 9100, Name: "box", Template: true, Tags: buildTags},
		{VMID: 9200, Name: "broken", Template: true, Tags: buildTags},
	}}
	cat, err := templatebuild.NewCatalog(templatebuild.CatalogOptions{List: l.list, Ledger: host})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got, ok, err := cat.Template(ctx, "box"); err != nil || !ok || got != (apitype.TemplateInfo{Name: "box", VMID: 9100, Built: true, Image: img}) {
		t.Errorf("box beside a bad record: %+v %v %v, want VM 9100 built from %s", got, ok, err, img)
	}
	if _, _, err := cat.Template(ctx, "broken"); !errors.Is(err, sandbox.ErrNotConfigured) || !strings.Contains(err.Error(), "9200") {
		t.Errorf("the name of the bad record: %v, want an error naming VM 9200", err)
	}
	if _, ok, err := cat.Template(ctx, "none"); err != nil || ok {
		t.Errorf("a name without a template beside a bad record: %v %v, want not found", ok, err)
	}
}
