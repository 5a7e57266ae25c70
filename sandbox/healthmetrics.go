package sandbox

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// healthMetrics are the health monitor's metrics: node-level counters and
// the per-sandbox series. The per-sandbox series are collected from the
// monitor's tracks at scrape time, so their cardinality is the ready
// sandboxes' VMs (bounded by the caps) and a sandbox's series go with it.
type healthMetrics struct {
	changes *prometheus.CounterVec
	breaks  *prometheus.CounterVec
	busy    *prometheus.CounterVec
	vms     *vmCollector
}

func newHealthMetrics(reg prometheus.Registerer, hm *healthMonitor) (*healthMetrics, error) {
	m := &healthMetrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "sandbox_health_changes_total",
			Help: "Sandbox health changes, by the new state and reason.",
		}, []string{"state", "reason"}),
		breaks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "sandbox_breaks_total",
			Help: "Sandboxes that turned broken, by reason.",
		}, []string{"reason"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "sandbox_health_pings_refused_busy_total",
			Help: "Health pings the daemon's own guest buffer budget refused (node or owner busy): no verdict on the agent that round, by the sandbox's owner (\"-\" for none).",
		}, []string{"owner"}),
		vms: newVMCollector(hm),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.changes, m.breaks, m.busy, m.vms} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// vmCollector exports one series per ready sandbox member (VM or
// container) and signal, labelled sandbox, vm, vmid and owner; a VM
// without a guest agent has no agent series (rtt, silence, up).
type vmCollector struct {
	hm                                      *healthMonitor
	cpu, mem, peak, oom, rd, wr, rtt, since *prometheus.Desc
	netBytes, netPackets, health, up        *prometheus.Desc
}

var vmLabels = []string{"sandbox", "vm", "vmid", "owner"}

func newVMCollector(hm *healthMonitor) *vmCollector {
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("pve_inspect_sandbox_vm_"+name, help, append(append([]string{}, vmLabels...), extra...), nil)
	}
	return &vmCollector{hm: hm,
		cpu:        d("cpu_seconds_total", "CPU time of the member's cgroup on the node (a VM's qemu.slice/<vmid>.scope, a container's lxc/<vmid>)."),
		mem:        d("memory_bytes", "Memory in use by the member's cgroup on the node."),
		peak:       d("memory_peak_bytes", "Peak memory of the member's cgroup on the node."),
		oom:        d("oom_kills_total", "OOM kills counted in the member's cgroup on the node."),
		rd:         d("disk_read_bytes_total", "Bytes the member's cgroup read from block devices."),
		wr:         d("disk_write_bytes_total", "Bytes the member's cgroup wrote to block devices."),
		netBytes:   d("network_bytes_total", "Bytes through the member's tap devices (a container's veths), by direction (to_guest, from_guest).", "direction"),
		netPackets: d("network_packets_total", "Packets through the member's tap devices (a container's veths), by direction (to_guest, from_guest).", "direction"),
		rtt:        d("agent_rtt_seconds", "Round trip of the last answered guest agent ping (a container's: the daemon entering it)."),
		since:      d("agent_silence_seconds", "Seconds since the guest agent last answered a ping."),
		health:     d("health", "1 for the VM's health state (ok, degraded, broken), 0 for the others.", "state"),
		up:         d("agent_up", "1 when the last guest agent ping was answered."),
	}
}

// Describe implements prometheus.Collector.
func (c *vmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.mem, c.peak, c.oom, c.rd, c.wr, c.netBytes, c.netPackets, c.rtt, c.since, c.health, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *vmCollector) Collect(ch chan<- prometheus.Metric) {
	c.hm.mu.Lock()
	defer c.hm.mu.Unlock()
	for id, t := range c.hm.sb {
		for _, v := range t.h.VMs {
			l := []string{id, v.Name, strconv.Itoa(v.VMID), t.owner}
			h := v.Host
			m := func(d *prometheus.Desc, typ prometheus.ValueType, val float64, extra ...string) {
				ch <- prometheus.MustNewConstMetric(d, typ, val, append(append([]string{}, l...), extra...)...)
			}
			m(c.cpu, prometheus.CounterValue, h.CPUSeconds)
			m(c.mem, prometheus.GaugeValue, float64(h.MemoryBytes))
			m(c.peak, prometheus.GaugeValue, float64(h.MemoryPeakBytes))
			m(c.oom, prometheus.CounterValue, float64(h.OOMKills))
			m(c.rd, prometheus.CounterValue, float64(h.DiskReadBytes))
			m(c.wr, prometheus.CounterValue, float64(h.DiskWriteBytes))
			m(c.netBytes, prometheus.CounterValue, float64(h.NetBytesToGuest), "to_guest")
			m(c.netBytes, prometheus.CounterValue, float64(h.NetBytesFromGuest), "from_guest")
			m(c.netPackets, prometheus.CounterValue, float64(h.NetPacketsToGuest), "to_guest")
			m(c.netPackets, prometheus.CounterValue, float64(h.NetPacketsFromGuest), "from_guest")
			if !h.NoAgent {
				// a VM without an agent has no agent series: a 0 of
				// agent_up would read as an agent down
				m(c.rtt, prometheus.GaugeValue, h.AgentRTTSeconds)
				m(c.since, prometheus.GaugeValue, h.SecondsSinceAgentAnswer)
				up := 0.0
				if h.AgentOK {
					up = 1
				}
				m(c.up, prometheus.GaugeValue, up)
			}
			for _, s := range []string{apitype.HealthOK, apitype.HealthDegraded, apitype.HealthBroken} {
				val := 0.0
				if v.State == s {
					val = 1
				}
				m(c.health, prometheus.GaugeValue, val, s)
			}
		}
	}
}
