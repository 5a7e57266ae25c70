package sandbox

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// NodeReader reads a sandbox member's counters from the node's cgroup
// and sysfs trees.
//
// A VM: qemu-server runs every VM in the systemd scope
// qemu.slice/<vmid>.scope (PVE::QemuServer::vm_start_nolock, through
// PVE::Systemd::enter_systemd_scope) and names its NICs tap<vmid>i<n>
// (PVE::QemuServer::print_netdev_full).
//
// A container: pve-container has lxc make its cgroup lxc/<vmid>, the
// container's own processes in the delegated child ns
// (PVE::LXC::update_lxc_config: lxc.cgroup.dir.container = lxc/$vmid,
// lxc.cgroup.dir.container.inner = ns), and names its NICs
// veth<vmid>i<n> on the node (update_lxc_config: lxc.net.$ind.veth.pair =
// veth${vmid}i${ind}). Proxmox's own status reads the outer, limiting
// cgroup lxc/<vmid> (PVE::LXC::vmstatus through PVE::LXC::CGroup; pve-common
// PVE::CGroup get_memory_stat, get_cpu_stat, get_io_stats with
// $limiting set; read_cgroup_pressure("lxc/${vmid}")) and counts the
// veths' bytes (vmstatus: netout += a veth's receive), and so does this
// reader: the outer cgroup holds the container's ns and the daemon's exec
// cgroups (ctguest) beside it, all of which the container's memory cap
// covers.
//
// The node in a box (testvm) builds both layouts, so this code reads a
// node and the bed alike. Both cgroup layouts are read: the unified (v2)
// tree Proxmox VE 8 and 9 boot with (cpu.stat, memory.current,
// memory.peak, memory.events, io.stat, every one counting the cgroup's
// descendants) and, for the files a v2 tree lacks because its controller
// is bound to a v1 hierarchy (hybrid hosts), the v1 ones
// (memory.usage_in_bytes, memory.max_usage_in_bytes, memory.oom_control's
// oom_kill, cpuacct.usage, blkio.throttle.io_service_bytes_recursive, or
// without _recursive where a kernel lacks it).
type NodeReader struct {
	// CgroupRoot is where the cgroup trees are mounted (/sys/fs/cgroup).
	CgroupRoot string
	// Parent is a path inside every hierarchy above qemu.slice and lxc
	// ("" on a node; a test bed's own subtree).
	Parent string
	// ContainerCgroups, when set, is the cgroup v2 directory holding each
	// container's cgroup <vmid> ([api] container_cgroups: a daemon whose
	// /sys/fs/cgroup is not the node's sees the tree elsewhere); "" is
	// lxc under CgroupRoot and Parent. The v1 hierarchies of a hybrid host
	// are always found under CgroupRoot.
	ContainerCgroups string
	// NetRoot is the sysfs net class of the members' taps and veths
	// (/sys/class/net).
	NetRoot string
}

// VMStats implements NodeStats: VM vmid's scope and taps.
func (r NodeReader) VMStats(vmid, nics int) VMStats {
	scope := filepath.Join("qemu.slice", strconv.Itoa(vmid)+".scope")
	return r.stats(func(hier string) string { return r.dir(hier, scope) }, "tap", "taps", vmid, nics)
}

// CTStats implements NodeStats: container vmid's cgroup and veths.
func (r NodeReader) CTStats(vmid, nics int) VMStats {
	rel := filepath.Join("lxc", strconv.Itoa(vmid))
	return r.stats(func(hier string) string {
		if (hier == "" || hier == "unified") && r.ContainerCgroups != "" {
			return filepath.Join(r.ContainerCgroups, strconv.Itoa(vmid))
		}
		return r.dir(hier, rel)
	}, "veth", "veths", vmid, nics)
}

// stats reads the cgroup whose directory in hierarchy hier is dir(hier)
// and the NICs <prefix><vmid>i<n>, naming absent ones ports in Missing
// (a member of no NIC, nics 0, misses none).
func (r NodeReader) stats(dir func(hier string) string, prefix, ports string, vmid, nics int) VMStats {
	var st VMStats
	if !readCgroup(dir, &st) {
		st.Missing = append(st.Missing, "cgroup")
	}
	if nics > 0 && !r.readPorts(prefix, vmid, nics, &st) {
		st.Missing = append(st.Missing, ports)
	}
	return st
}

// dir returns rel's directory in hierarchy hier ("" is the unified tree
// of a pure v2 host).
func (r NodeReader) dir(hier, rel string) string {
	root := r.CgroupRoot
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	return filepath.Join(root, hier, r.Parent, rel)
}

// readCgroup fills the cgroup counters of the cgroup whose directory in
// hierarchy hier is dir(hier); false when it has none.
func readCgroup(dir func(hier string) string, st *VMStats) bool {
	v2 := dir("")
	if _, err := os.Stat(filepath.Join(v2, "cgroup.procs")); err != nil {
		v2 = dir("unified")
	}
	found := false
	if kv, ok := readKV(filepath.Join(v2, "cpu.stat")); ok {
		st.CPUSeconds, found = float64(kv["usage_usec"])/1e6, true
	} else if n, ok := readUint(filepath.Join(dir("cpuacct"), "cpuacct.usage")); ok {
		st.CPUSeconds, found = float64(n)/1e9, true
	}
	if n, ok := readUint(filepath.Join(v2, "memory.current")); ok {
		st.MemoryBytes, found = n, true
		st.MemoryPeakBytes, _ = readUint(filepath.Join(v2, "memory.peak"))
		if kv, ok := readKV(filepath.Join(v2, "memory.events")); ok {
			st.OOMKills = kv["oom_kill"]
		}
	} else if n, ok := readUint(filepath.Join(dir("memory"), "memory.usage_in_bytes")); ok {
		v1 := dir("memory")
		st.MemoryBytes, found = n, true
		st.MemoryPeakBytes, _ = readUint(filepath.Join(v1, "memory.max_usage_in_bytes"))
		if kv, ok := readKV(filepath.Join(v1, "memory.oom_control")); ok {
			st.OOMKills = kv["oom_kill"]
		}
	}
	if rd, wr, ok := readIOStat(filepath.Join(v2, "io.stat")); ok {
		st.DiskReadBytes, st.DiskWriteBytes, found = rd, wr, true
	} else if rd, wr, ok := readBlkio(filepath.Join(dir("blkio"), "blkio.throttle.io_service_bytes_recursive")); ok {
		st.DiskReadBytes, st.DiskWriteBytes, found = rd, wr, true
	} else if rd, wr, ok := readBlkio(filepath.Join(dir("blkio"), "blkio.throttle.io_service_bytes")); ok {
		st.DiskReadBytes, st.DiskWriteBytes, found = rd, wr, true
	}
	return found
}

// readPorts adds the counters of <prefix><vmid>i0..i<nics-1> (a VM's
// taps, a container's veths); false when none exists. A port's rx is
// what the guest sent, its tx what it received.
func (r NodeReader) readPorts(prefix string, vmid, nics int, st *VMStats) bool {
	root := r.NetRoot
	if root == "" {
		root = "/sys/class/net"
	}
	found := false
	for i := range nics {
		dir := filepath.Join(root, prefix+strconv.Itoa(vmid)+"i"+strconv.Itoa(i), "statistics")
		rb, ok := readUint(filepath.Join(dir, "rx_bytes"))
		if !ok {
			continue
		}
		found = true
		tb, _ := readUint(filepath.Join(dir, "tx_bytes"))
		rp, _ := readUint(filepath.Join(dir, "rx_packets"))
		tp, _ := readUint(filepath.Join(dir, "tx_packets"))
		st.NetBytesFromGuest += rb
		st.NetBytesToGuest += tb
		st.NetPacketsFromGuest += rp
		st.NetPacketsToGuest += tp
	}
	return found
}

// maxCgroupFile bounds what is read of one cgroup or sysfs file.
const maxCgroupFile = 64 << 10

func readSmall(path string) ([]byte, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b := make([]byte, maxCgroupFile)
	n, _ := f.Read(b)
	return b[:n], n > 0
}

func readUint(path string) (uint64, bool) {
	b, ok := readSmall(path)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// readKV parses "key value" lines (cpu.stat, memory.events,
// memory.oom_control).
func readKV(path string) (map[string]uint64, bool) {
	b, ok := readSmall(path)
	if !ok {
		return nil, false
	}
	return parseKV(b), true
}

func parseKV(b []byte) map[string]uint64 {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// readIOStat sums rbytes and wbytes over the devices of a v2 io.stat
// ("8:0 rbytes=1 wbytes=2 rios=3 ...").
func readIOStat(path string) (rd, wr uint64, ok bool) {
	b, ok := readSmall(path)
	if !ok {
		_, err := os.Stat(path)
		return 0, 0, err == nil // an empty io.stat is zero, not absent
	}
	rd, wr = parseIOStat(b)
	return rd, wr, true
}

func parseIOStat(b []byte) (rd, wr uint64) {
	for _, line := range strings.Split(string(b), "\n") {
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "rbytes":
				rd += n
			case "wbytes":
				wr += n
			}
		}
	}
	return rd, wr
}

// readBlkio sums Read and Write of a v1 blkio.throttle.io_service_bytes
// ("8:0 Read 123", ..., "Total 456").
func readBlkio(path string) (rd, wr uint64, ok bool) {
	b, ok := readSmall(path)
	if !ok {
		_, err := os.Stat(path)
		return 0, 0, err == nil
	}
	rd, wr = parseBlkio(b)
	return rd, wr, true
}

func parseBlkio(b []byte) (rd, wr uint64) {
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		n, err := strconv.ParseUint(f[2], 10, 64)
		if err != nil {
			continue
		}
		switch f[1] {
		case "Read":
			rd += n
		case "Write":
			wr += n
		}
	}
	return rd, wr
}
