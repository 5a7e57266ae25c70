package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestBedClusterThreeNodes is issue 36's cluster acceptance on a bed of
// three nodes, each with its daemon and a warm pool of two members that
// refills while the creates run:
//
//   - 30 creates per daemon at once (90), then 30 deletes per daemon at
//     once: all succeed; every sandbox answers an exec on its own node,
//     with its vnets' bridges and its dnsmasq there and its bridges on no
//     other node; ids, VMIDs and CIDRs (pool members' too) never collide;
//     nothing of them is left;
//   - pve3 stops during a second wave of 10 creates per daemon: pve3's
//     creates not done by then fail saying the node does not answer,
//     pve1's and pve2's all succeed; back up, everything pve3's daemon
//     still lists (creates that failed half-way too) is deleted;
//   - pve2's daemon dies mid-clone while pve1 and pve3 create 10 each;
//     restarted on its state, it re-adopts its pool, tears the half-made
//     sandbox down once the clone lands, leaves no VM (not even one only
//     root sees) and creates again;
//   - at the end every pool is drained (each daemon restarted without
//     one), and the cluster holds nothing: no VM but the templates, no
//     volume on any node's storages, no zone, vnet, subnet or IPAM entry,
//     no dnsmasq, guest or bridge on any node.
func TestBedClusterThreeNodes(t *testing.T) {
	testkit.RequireRoot(t, "dnsmasq", "qemu-ga")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	const (
		perNode = 30 // the first wave, per daemon
		wave2   = 10 // per daemon, pve3 stopping mid-run
		wave3   = 10 // per surviving daemon, pve2's daemon dying mid-clone
		target  = 2  // warm pool members per daemon
	)
	began, last := time.Now(), time.Now()
	lap := func(what string) {
		t.Logf("%s took %s (%s since the start)", what, time.Since(last).Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
		last = time.Now()
	}
	emu, nodes := newClusterBed(t, ctx, 3, func(o *options) {
		o.WarmPool = []sandbox.PoolShape{{Name: "warm", Template: "debian", Target: target}}
	})
	for _, n := range nodes {
		waitPoolReady(t, ctx, n, target)
	}
	lap("three nodes up, pools full")
	plain := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}

	// 1. 90 creates at once, then 90 deletes at once.
	before := make([][]string, len(nodes))
	for i, n := range nodes {
		before[i] = memberIDs(n)
	}
	reqs := len(emu.Requests())
	wave1, errs := createWave(ctx, nodes, sameForAll(len(nodes), perNode), plain)
	for _, err := range errs {
		t.Error(err)
	}
	if len(wave1) != len(nodes)*perNode {
		t.Errorf("%d sandboxes made in the first wave, want %d", len(wave1), len(nodes)*perNode)
	}
	lap(fmt.Sprintf("first wave: %d creates", len(nodes)*perNode))
	logWave(t, wave1, emu.Requests()[reqs:])
	claims := make([]int, len(nodes))
	for _, m := range wave1 {
		if m.sb.FromPool {
			claims[m.node]++
		}
	}
	for i, n := range nodes {
		if claims[i] < target {
			t.Errorf("%s: %d creates claimed a pool member, want at least the %d ready before the wave", n.name, claims[i], target)
		}
	}
	for i, n := range nodes {
		// the members claimed are being replaced while the wave runs (a
		// refill at a time: the second may not have begun yet)
		if now := memberIDs(n); len(now) == 0 || slices.ContainsFunc(now, func(id string) bool { return slices.Contains(before[i], id) }) {
			t.Errorf("%s: members after the wave %v (before it %v), want new ones", n.name, now, before[i])
		}
	}
	t.Logf("pool claims per daemon in the first wave: %v", claims)
	assertServing(t, ctx, nodes, wave1)
	assertDistinct(t, nodes, wave1)
	lap("first wave: exec, bridge and collision checks")
	for _, err := range deleteAll(ctx, nodes, wave1) {
		t.Error(err)
	}
	lap(fmt.Sprintf("first wave: %d deletes", len(wave1)))
	assertSandboxesGone(t, ctx, emu, nodes, idsOf(wave1))
	if t.Failed() {
		t.FailNow()
	}

	// 2. pve3 stops mid-run.
	wave2Made := stopNodeMidWave(t, ctx, emu, nodes, 2, wave2, plain)
	lap("second wave, pve3 stopped mid-run")
	if err := emu.SetNodeOnline(nodes[2].name, true); err != nil {
		t.Fatal(err)
	}
	gone := idsOf(wave2Made)
	var left []made
	for i, n := range nodes {
		l, err := n.c.List(ctx)
		if err != nil {
			t.Fatalf("%s: list: %v", n.name, err)
		}
		for _, sb := range l {
			left = append(left, made{node: i, sb: sb})
			gone[sb.ID] = true
		}
	}
	for _, err := range deleteAll(ctx, nodes, left) {
		t.Error(err)
	}
	assertSandboxesGone(t, ctx, emu, nodes, gone)
	lap(fmt.Sprintf("second wave: pve3 back, %d deletes", len(left)))
	if t.Failed() {
		t.FailNow()
	}

	// 3. pve2's daemon dies mid-clone while the others create.
	wave3Made := killMidClone(t, ctx, emu, nodes, 1, wave3)
	lap("third wave, pve2's daemon killed mid-clone and restarted")
	for _, err := range deleteAll(ctx, nodes, wave3Made) {
		t.Error(err)
	}
	assertSandboxesGone(t, ctx, emu, nodes, idsOf(wave3Made))
	lap(fmt.Sprintf("third wave: %d deletes", len(wave3Made)))

	// 4. Drain the pools: each daemon restarted without one tears its
	// members down.
	for _, n := range nodes {
		n.stopPool()
		n.opts.WarmPool = nil
		n.start(t, ctx)
		if p := n.srv.Engine().Pool(); len(p.Members) != 0 {
			t.Errorf("%s: members after a restart without a pool: %+v", n.name, p.Members)
		}
	}
	lap("pools drained")
	assertClusterEmpty(t, ctx, emu, nodes)
	for _, n := range nodes {
		l := n.logs.String()
		t.Logf("%s: %d SDN applies made again for a missing bridge, %d creates backed off a range another node took", n.name,
			strings.Count(l, "sdn apply ended OK without some of its bridges"), strings.Count(l, "took the range too"))
	}
}

// stopNodeMidWave sends per creates of req to every daemon at once and
// takes node down once its daemon's third create of the wave is back:
// that daemon's creates succeed (done before the stop) or fail saying the
// node does not answer; every other daemon's succeed and answer, and
// one more create on each warns of the node's failed reload. It returns
// what was made; the node stays down.
func stopNodeMidWave(t *testing.T, ctx context.Context, emu *pveemu.Server, nodes []*clusterNode, down, per int, req apitype.CreateRequest) []made {
	t.Helper()
	var (
		mu       sync.Mutex
		out      []made
		failedOn []string
		back     atomic.Int32
		once     sync.Once
		stopErr  error
	)
	stop := func() { once.Do(func() { stopErr = emu.SetNodeOnline(nodes[down].name, false) }) }
	errs := allAtOnce(sameForAll(len(nodes), per), func(ni, k int) error {
		sb, err := nodes[ni].c.Create(ctx, req)
		if ni == down && back.Add(1) == 3 {
			stop()
		}
		if err != nil {
			return fmt.Errorf("%s create %d: %w", nodes[ni].name, k, err)
		}
		mu.Lock()
		out = append(out, made{node: ni, sb: sb})
		mu.Unlock()
		return nil
	})
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	for _, err := range errs {
		if strings.HasPrefix(err.Error(), nodes[down].name+" ") && strings.Contains(err.Error(), "does not answer (is the node down?)") {
			failedOn = append(failedOn, err.Error())
			continue
		}
		t.Error(err)
	}
	counts := make([]int, len(nodes))
	var up []made
	for _, m := range out {
		counts[m.node]++
		if m.node != down {
			up = append(up, m)
		}
	}
	for i, n := range nodes {
		if i != down && counts[i] != per {
			t.Errorf("%s: %d of %d creates made while %s went down", n.name, counts[i], per, nodes[down].name)
		}
	}
	if len(failedOn) == 0 {
		t.Errorf("no create of %s failed after it went down", nodes[down].name)
	}
	t.Logf("%s: %d creates made before it went down, %d failed saying it does not answer", nodes[down].name, counts[down], len(failedOn))
	// Still down: one more create on each other daemon, at once, of a
	// shape no pool member has (so it applies); each one's apply only
	// warns of the node that is down.
	per1 := sameForAll(len(nodes), 1)
	per1[down] = 0
	more, errs := createWave(ctx, nodes, per1, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Cores: 2}}})
	for _, err := range errs {
		t.Error(err)
	}
	for i, n := range nodes {
		if i != down && !strings.Contains(n.logs.String(), "another cluster node failed its network reload") {
			t.Errorf("%s's daemon did not log %s's reload warning", n.name, nodes[down].name)
		}
	}
	up = append(up, more...)
	assertServing(t, ctx, nodes, up)
	return append(out, more...)
}

// killMidClone kills the daemon of nodes[victim] while a create's clone
// runs on its node (deadDaemon, the emulator holding that node's clones)
// and, while it lies dead, has every other daemon create per sandboxes at
// once; then it restarts the daemon on its state. The restart must
// re-adopt the pool, tear the half-made sandbox down once its clone lands
// and leave no VM on the node but the templates and its members; the other
// daemons' creates all succeed, and the restarted daemon creates again.
// It returns the sandboxes made (the others' and the restarted daemon's).
func killMidClone(t *testing.T, ctx context.Context, emu *pveemu.Server, nodes []*clusterNode, victim, per int) []made {
	t.Helper()
	v := nodes[victim]
	// quiet, its pool full: what dies is a create, not a refill
	want := 0
	for _, sh := range v.srv.Engine().Pool().Shapes {
		want += sh.Target
	}
	waitPoolReady(t, ctx, v, want)
	v.stopPool()
	members := memberIDs(v)
	held, release := emu.HoldClonesOn(v.name)
	defer release()
	dead, first := v.dead, v.srv.Engine()
	dead.alive.Store(false)
	per3 := sameForAll(len(nodes), per)
	per3[victim] = 0
	var others []made
	var othersErrs []error
	othersDone := make(chan struct{})
	go func() {
		defer close(othersDone)
		others, othersErrs = createWave(ctx, nodes, per3, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	}()
	// two cores: a shape no member has, so the create clones
	dieMidClone(t, ctx, first, dead, held, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "vm0", Template: "debian", Cores: 2}}})
	// The restart; the clone ends a second after it began.
	v.dead = aliveDaemon(v.px)
	v.opts.Proxmox = v.dead
	go func() { time.Sleep(time.Second); release() }()
	v.start(t, ctx)
	if l := v.srv.Engine().List(); len(l) != 0 {
		t.Errorf("%s: sandboxes after the restart's teardown: %+v", v.name, l)
	}
	if got := memberIDs(v); !slices.Equal(got, members) {
		t.Errorf("%s: members after the restart %v, want %v re-adopted", v.name, got, members)
	}
	vms, err := v.root.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range vms {
		if !vm.Template && !slices.ContainsFunc(members, func(id string) bool { return slices.Contains(vm.Tags, "pvei-s-"+id) }) {
			t.Errorf("%s: VM left after the restart (as root sees it): %+v", v.name, vm)
		}
	}
	<-othersDone
	for _, err := range othersErrs {
		t.Error(err)
	}
	if want := per * (len(nodes) - 1); len(others) != want {
		t.Errorf("%d sandboxes made while %s's daemon lay dead, want %d", len(others), v.name, want)
	}
	sb, err := v.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("%s: create after the restart: %v", v.name, err)
	}
	all := append(others, made{node: victim, sb: sb})
	assertServing(t, ctx, nodes, all)
	assertDistinct(t, nodes, all)
	return all
}

// memberIDs are the ids of the warm pool members of n's daemon, sorted.
func memberIDs(n *clusterNode) []string {
	var ids []string
	for _, m := range n.srv.Engine().Pool().Members {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// waitPoolReady waits (bounded by ctx) until n's pool has want members
// ready.
func waitPoolReady(t *testing.T, ctx context.Context, n *clusterNode, want int) {
	t.Helper()
	for {
		ready := 0
		for _, s := range n.srv.Engine().Pool().Shapes {
			ready += s.Ready
		}
		if ready >= want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: pool never had %d members ready: %+v", n.name, want, n.srv.Engine().Pool())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logWave logs how long a wave's creates took and what they asked of
// Proxmox: requests, SDN applies, clones.
func logWave(t *testing.T, ms []made, recs []pveemu.RequestRecord) {
	t.Helper()
	var took []time.Duration
	for _, m := range ms {
		took = append(took, m.took)
	}
	slices.Sort(took)
	if n := len(took); n > 0 {
		t.Logf("creates took p50 %s, p90 %s, max %s", took[n/2].Round(100*time.Millisecond), took[n*9/10].Round(100*time.Millisecond), took[n-1].Round(100*time.Millisecond))
	}
	applies, clones := 0, 0
	for _, r := range recs {
		switch {
		case r.Method == "PUT" && r.Route == "/cluster/sdn":
			applies++
		case r.Method == "POST" && r.Route == "/nodes/{node}/qemu/{vmid}/clone":
			clones++
		}
	}
	byRoute := map[string]int{}
	for _, r := range recs {
		byRoute[r.Method+" "+r.Route]++
	}
	routes := slices.Collect(maps.Keys(byRoute))
	slices.SortFunc(routes, func(a, b string) int { return byRoute[b] - byRoute[a] })
	var top []string
	for _, r := range routes[:min(5, len(routes))] {
		top = append(top, fmt.Sprintf("%s: %d", r, byRoute[r]))
	}
	t.Logf("the wave made %d API requests (most: %s), %d SDN applies (each reloads every node) and %d clones", len(recs), strings.Join(top, ", "), applies, clones)
}
