package main

import (
	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/bench/api"
	"github.com/pve-inspect/pve-inspect/bench/cluster"
	"github.com/pve-inspect/pve-inspect/bench/connlookup"
	"github.com/pve-inspect/pve-inspect/bench/container"
	"github.com/pve-inspect/pve-inspect/bench/egress"
	"github.com/pve-inspect/pve-inspect/bench/guard"
	"github.com/pve-inspect/pve-inspect/bench/layer2"
	"github.com/pve-inspect/pve-inspect/bench/lockdown"
	"github.com/pve-inspect/pve-inspect/bench/neighbour"
	"github.com/pve-inspect/pve-inspect/bench/pool"
	"github.com/pve-inspect/pve-inspect/bench/qga"
	"github.com/pve-inspect/pve-inspect/bench/scale"
)

// section is one benchmark group: a package under bench/ and its name for
// -only.
type section struct {
	name  string
	about string
	run   bench.Func
}

// sections is the one list of sections, in the order they run. A new
// section is a package under bench/ with a Section function and one line
// here (see package bench).
var sections = []section{
	{"guard", "host guard apply and route-change latency vs iptables scripts", guard.Section},
	{"layer2", "the guard's layer-2 table at 500 guest ports vs none", layer2.Section},
	{"lockdown", "marker-to-enforced latency vs the reference design's 60 s timer", lockdown.Section},
	{"qga", "guest agent client vs a raw loop and the Proxmox API's shape", qga.Section},
	{"api", "sandbox API on the emulator and the bed vs the client it sits on", api.Section},
	{"egress", "egress checks (resolver, Host/SNI proxy) vs an open zone", egress.Section},
	{"connlookup", "a guest connection's interface at 100 and 2000 bridges: the kernel's ingress index vs a dump of every address", connlookup.Section},
	{"scale", "the guard's per-change paths at 1, 500 and 2000 bridges and ports", scale.Section},
	{"pool", "a claim from the warm pool vs a cold create of the same shape, its Proxmox calls, 20 creates against a pool of 4", pool.Section},
	{"cluster", "creates per minute on one node and on three, an SDN apply at 10, 100 and 300 zones: shared applies vs one per create", cluster.Section},
	{"neighbour", "tenant B's exec, DNS, events and the node's APIs, alone vs while tenant A floods and holds every quota", neighbour.Section},
	{"container", "a one-container sandbox vs a one-VM sandbox of the same shape: cold create, exec round trip, pool claim, idle memory, the issue's goals", container.Section},
}
