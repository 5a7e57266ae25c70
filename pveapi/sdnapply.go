package pveapi

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// ApplySDN implements sandbox.Proxmox: PUT /cluster/sdn, which commits the
// whole pending SDN configuration (every client's edits, not only ours) and
// then reloads the network of every cluster node (pve-network
// API2/Network/SDN.pm reload). A node whose reload cannot be started only
// warns there ("warn $@ if $@") and the task ends "WARNINGS: n": a warning
// about this node, or one that names no other cluster node, fails the
// apply (VMs would then fail to start or get no lease); a warning about
// another node is logged and the apply succeeds, so one node down stops
// only its own creates. Pending edits this client did not make are logged
// before the apply commits them.
func (c *Client) ApplySDN(ctx context.Context) error {
	mine := c.own.take()
	if foreign, err := c.foreignPending(ctx, mine); err != nil {
		c.log.Warn("cannot list pending SDN edits before the apply", "err", err)
	} else if len(foreign) > 0 {
		c.log.Warn("the SDN apply commits pending edits this daemon did not make", "edits", strings.Join(foreign, ", "))
	}
	err := c.callTask(ctx, "PUT", "apply sdn", "/cluster/sdn", map[string]any{}, func(warns []string) []string {
		return c.ownNodeWarnings(ctx, warns)
	})
	if err != nil {
		c.own.restore(mine)
	}
	return err
}

// ownNodeWarnings keeps the reload warnings that fail an apply on this
// node: those naming this node and those naming no other member of the
// cluster (GET /nodes); it logs the others. When the node list cannot be
// read every warning is fatal.
func (c *Client) ownNodeWarnings(ctx context.Context, warns []string) []string {
	var ns []struct {
		Node string `json:"node"`
	}
	if err := c.c.Get(ctx, "/nodes", &ns); err != nil {
		return warns
	}
	members := map[string]bool{}
	for _, n := range ns {
		members[n.Node] = true
	}
	var fatal []string
	for _, w := range warns {
		node, ok := warningNode(w)
		if ok && node != c.node && members[node] {
			c.log.Warn("SDN apply: another cluster node failed its network reload", "node", node, "warning", w)
			continue
		}
		fatal = append(fatal, w)
	}
	return fatal
}

var (
	// reReloadCmd is the command reloadnetworkall runs per node
	// ($create_reload_network_worker: pvesh set /nodes/<node>/network),
	// which run_command names when it fails.
	reReloadCmd = regexp.MustCompile(`pvesh set /nodes/([a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?)/network\b`)
	// reNodePrefix is "<node>: ...", as the worker prints per node
	// ("$nodename: reloading network config").
	reNodePrefix = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?): `)
)

// warningNode names the node a reloadnetworkall warning is about.
func warningNode(w string) (string, bool) {
	if m := reReloadCmd.FindStringSubmatch(w); m != nil {
		return m[1], true
	}
	if m := reNodePrefix.FindStringSubmatch(w); m != nil {
		return m[1], true
	}
	return "", false
}

// pendingObject is a zone or vnet as GET ...?pending=1 lists it.
type pendingObject struct {
	Zone  string `json:"zone"`
	VNet  string `json:"vnet"`
	State string `json:"state"`
	Alias string `json:"alias"`
	// Pending holds a new or changed object's values.
	Pending *struct {
		Alias string `json:"alias"`
	} `json:"pending"`
}

// foreignPending lists the pending zone and vnet edits (state new, changed
// or deleted) that are not in mine, each as "<kind> <id> (<state>, whose)"
// where whose says whether it looks like another pve-inspect daemon's
// sandbox (a zone named like a sandbox id, a vnet whose alias carries the
// sandbox tag) or not. Subnet edits are not listed (they are per vnet, one
// request each).
func (c *Client) foreignPending(ctx context.Context, mine map[string]bool) ([]string, error) {
	var out []string
	for _, kind := range []string{"zone", "vnet"} {
		var objs []pendingObject
		if err := c.c.Get(ctx, "/cluster/sdn/"+kind+"s?pending=1", &objs); err != nil {
			return nil, fmt.Errorf("list pending %ss: %w", kind, err)
		}
		for _, o := range objs {
			id, alias := o.Zone, o.Alias
			if kind == "vnet" {
				id = o.VNet
				if alias == "" && o.Pending != nil {
					alias = o.Pending.Alias
				}
			}
			if o.State == "" || mine[kind+" "+id] {
				continue
			}
			whose := "not pve-inspect's"
			if (kind == "zone" && reSandboxID.MatchString(id)) || strings.Contains(alias, "pvei-s-") {
				whose = "another pve-inspect daemon's sandbox"
			}
			out = append(out, fmt.Sprintf("%s %s (%s, %s)", kind, id, o.State, whose))
		}
	}
	sort.Strings(out)
	return out, nil
}

// reSandboxID is the form of a sandbox id, which is also its zone's id.
var reSandboxID = regexp.MustCompile(`^sb[a-z0-9]{6}$`)

// sdnEdits records the zones, vnets and subnets a client edited since its
// last apply ("zone <id>", "vnet <id>", "subnet <vnet> <cidr>"), each with
// the generation of its last write, so that dropping a snapshot keeps an
// edit made again since.
type sdnEdits struct {
	mu  sync.Mutex
	seq uint64
	ids map[string]uint64
}

func newSDNEdits() *sdnEdits { return &sdnEdits{ids: map[string]uint64{}} }

func (e *sdnEdits) add(kind, id string) {
	e.mu.Lock()
	e.seq++
	e.ids[kind+" "+id] = e.seq
	e.mu.Unlock()
}

// take returns the edits so far and starts a new set.
func (e *sdnEdits) take() map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]bool, len(e.ids))
	for id := range e.ids {
		out[id] = true
	}
	e.ids = map[string]uint64{}
	return out
}

// snapshot returns the edits so far with their generations, keeping them.
func (e *sdnEdits) snapshot() map[string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.ids)
}

// drop removes the edits of snap not written again since it was taken.
func (e *sdnEdits) drop(snap map[string]uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, gen := range snap {
		if e.ids[id] == gen {
			delete(e.ids, id)
		}
	}
}

// restore puts edits back after an apply that failed (they are still
// pending).
func (e *sdnEdits) restore(ids map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id := range ids {
		if _, ok := e.ids[id]; !ok {
			e.seq++
			e.ids[id] = e.seq
		}
	}
}
