package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// DefaultCatalogAge is how long a Catalog answers from one look at the
// node (CatalogOptions.MaxAge).
const DefaultCatalogAge = 10 * time.Second

// DefaultCatalogLookTimeout bounds one look at the node
// (CatalogOptions.LookTimeout).
const DefaultCatalogLookTimeout = 30 * time.Second

// CatalogOptions configure a Catalog.
type CatalogOptions struct {
	// List lists the node's VMs, templates among them, as the credential
	// of its caller sees them (the daemon's sandbox token: the templates
	// a create may clone).
	List func(ctx context.Context) ([]sandbox.VMInfo, error)
	// Ledger is the build ledger (NodeHost, read only).
	Ledger interface {
		Recorded(vmid int) (Record, bool, error)
	}
	// Pinned are the templates the daemon's configuration names by VMID
	// ([api] templates): a create of such a name clones that VM, whatever
	// its own name.
	Pinned map[string]int
	// MaxAge is how long one look at the node answers every question
	// (DefaultCatalogAge); Forget ends it early.
	MaxAge time.Duration
	// LookTimeout bounds one look at the node (DefaultCatalogLookTimeout),
	// whoever is still waiting for it.
	LookTimeout time.Duration
	Now         func() time.Time
}

// Catalog says, for each template name a create may give, which VM it
// clones and what the build ledger records of it (GET
// /v1/templates/{name}, and Service.Template when no build of the name is
// remembered). A create clones the configured VM of a pinned name, else
// the template of the name with the lowest VMID (pveapi TemplateID); a
// VM is the builds' when the ledger records it as a template sealed under
// its own name and it still is as the build left it (a template in no
// pool, tagged as a build's template, not building). The hardened profile
// is not checked here: a create checks it.
//
// Every question is answered from one look at the node (a list of its
// VMs and one ledger file per template a build tagged), taken at most
// once per MaxAge however many callers ask: whichever caller finds the
// last one stale starts it, and every caller, that one too, waits for it
// until its own context ends; a look that failed is the answer for as
// long (a ledger record that cannot be read fails only the question of
// the name whose template it is). The look is the catalog's, not its
// caller's: it runs in a goroutine of its own under the catalog's
// LookTimeout (its stop), so a caller that leaves (a client that hangs up
// at once) neither ends it nor loses its answer for the others. So no
// caller, whatever its rate, makes the node or the ledger work more than
// once per MaxAge. Forget (a build that ended) makes the next question
// look again.
type Catalog struct {
	o CatalogOptions

	// The mutex protects the following elements; a leaf (the look at the
	// node runs outside it).
	mu sync.Mutex
	// snap and err are the last look's answer, at when it began (zero:
	// none, or forgotten).
	snap map[string]catalogEntry
	err  error
	at   time.Time
	// looking is closed when the look in flight ends (nil: none).
	looking chan struct{}
	// gen counts Forget calls: a look begun before one is not kept.
	gen uint64
}

// NewCatalog returns a Catalog over o (List and Ledger required).
func NewCatalog(o CatalogOptions) (*Catalog, error) {
	if o.List == nil || o.Ledger == nil {
		return nil, errors.New("templatebuild: a catalog needs List and Ledger")
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultCatalogAge
	}
	if o.LookTimeout <= 0 {
		o.LookTimeout = DefaultCatalogLookTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Catalog{o: o}, nil
}

// Template is what the catalog knows of the template name (false: the
// node has no VM template a create of the name would clone).
func (c *Catalog) Template(ctx context.Context, name string) (apitype.TemplateInfo, bool, error) {
	snap, err := c.snapshot(ctx)
	if err != nil {
		return apitype.TemplateInfo{}, false, err
	}
	t, ok := snap[name]
	return t.info, ok && t.err == nil, t.err
}

// catalogEntry is what one look says of a name: its template, or why the
// ledger cannot say (that name's question fails, no other's).
type catalogEntry struct {
	info apitype.TemplateInfo
	err  error
}

// Forget makes the next question look at the node again (a build ended:
// a template may have come).
func (c *Catalog) Forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.at = time.Time{}
}

// snapshot is the last look's answer while it is fresh, else a new look's
// (one at a time: a caller finding one in flight waits for it; the look
// runs in its own goroutine, kept whether or not its starter still waits).
func (c *Catalog) snapshot(ctx context.Context) (map[string]catalogEntry, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c.mu.Lock()
		if !c.at.IsZero() && c.o.Now().Sub(c.at) < c.o.MaxAge {
			snap, err := c.snap, c.err
			c.mu.Unlock()
			return snap, err
		}
		wait := c.looking
		if wait == nil {
			wait = make(chan struct{})
			c.looking, c.at = wait, time.Time{}
			go c.lookAndKeep(context.WithoutCancel(ctx), c.gen, c.o.Now(), wait)
		}
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// lookAndKeep looks at the node (bounded by LookTimeout, whoever waits)
// and keeps the answer as of began unless a Forget came meanwhile (gen
// is no longer the catalog's), then closes done.
func (c *Catalog) lookAndKeep(ctx context.Context, gen uint64, began time.Time, done chan struct{}) {
	ctx, cancel := context.WithTimeout(ctx, c.o.LookTimeout)
	defer cancel()
	snap, err := c.look(ctx)
	c.mu.Lock()
	c.looking = nil
	if gen == c.gen {
		c.snap, c.err, c.at = snap, err, began
	}
	c.mu.Unlock()
	close(done)
}

// look lists the node's templates and reads the ledger of those a build
// tagged.
func (c *Catalog) look(ctx context.Context) (map[string]catalogEntry, error) {
	vms, err := c.o.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the node's templates: %w", err)
	}
	slices.SortFunc(vms, func(a, b sandbox.VMInfo) int { return a.VMID - b.VMID })
	byID := map[int]sandbox.VMInfo{}
	clones := map[string]int{}
	for _, v := range vms {
		byID[v.VMID] = v
		if _, ok := clones[v.Name]; v.Template && v.Name != "" && !ok {
			clones[v.Name] = v.VMID
		}
	}
	for name, id := range c.o.Pinned {
		clones[name] = id
	}
	out := make(map[string]catalogEntry, len(clones))
	for name, id := range clones {
		t := apitype.TemplateInfo{Name: name, VMID: id}
		if v, ok := byID[id]; ok {
			rec, built, err := ledgerTemplate(c.o.Ledger, v, nil)
			if err != nil {
				out[name] = catalogEntry{err: fmt.Errorf("build ledger of VM %d: %w: %w", id, err, sandbox.ErrNotConfigured)}
				continue
			}
			t.Built, t.Image, t.BuildMode = built, rec.Image, apitype.BuildMode(rec.Mode)
		}
		out[name] = catalogEntry{info: t}
	}
	return out, nil
}

// ledgerTemplate is the ledger's record of v when it is a template a
// build on this node sealed under v's own name and v is still as the
// build left it: a template in no pool, not tagged building, carrying
// the build's template tags and tags (false: it is not the builds').
// Only such a VM's record is read.
func ledgerTemplate(ledger interface {
	Recorded(vmid int) (Record, bool, error)
}, v sandbox.VMInfo, tags []string) (Record, bool, error) {
	if !v.Template || v.Pool != "" || slices.Contains(v.Tags, TagBuilding) ||
		!hasAll(v.Tags, []string{TagInspect, TagTemplate}) || !hasAll(v.Tags, tags) {
		return Record{}, false, nil
	}
	rec, ok, err := ledger.Recorded(v.VMID)
	if err != nil || !ok || rec.Name != v.Name || rec.State != StateTemplate {
		return Record{}, false, err
	}
	return rec, true, nil
}
