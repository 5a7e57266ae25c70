package sandbox_test

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestNodeReader: the same reader reads a pure cgroup v2 node (Proxmox VE
// 8 and 9), a hybrid host (v1 memory, cpuacct and blkio beside the
// unified tree: the test bed's machines) and the VM's taps, and names the
// sources that are absent. A container's counters come from its outer
// cgroup lxc/<vmid> (its processes run in the ns child, the daemon's
// execs beside it: the outer files count them all) and its veths, never
// from a VM's scope or taps of the same id.
func TestNodeReader(t *testing.T) {
	write := func(t *testing.T, root string, files map[string]string) {
		for p, c := range files {
			p = filepath.Join(root, p)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	taps := map[string]string{
		"net/tap101i0/statistics/rx_bytes": "100\n", "net/tap101i0/statistics/tx_bytes": "200\n",
		"net/tap101i0/statistics/rx_packets": "1\n", "net/tap101i0/statistics/tx_packets": "2\n",
		"net/tap101i1/statistics/rx_bytes": "1000\n", "net/tap101i1/statistics/tx_bytes": "2000\n",
		"net/tap101i1/statistics/rx_packets": "10\n", "net/tap101i1/statistics/tx_packets": "20\n",
	}
	veths := map[string]string{
		"net/veth101i0/statistics/rx_bytes": "300\n", "net/veth101i0/statistics/tx_bytes": "400\n",
		"net/veth101i0/statistics/rx_packets": "3\n", "net/veth101i0/statistics/tx_packets": "4\n",
	}
	// a VM's scope and taps of the same id, which a container's read must
	// not take
	decoys := map[string]string{
		"cg/qemu.slice/101.scope/cgroup.procs": "", "cg/qemu.slice/101.scope/memory.current": "999\n",
		"cg/unified/bed1/qemu.slice/101.scope/cgroup.procs": "", "cg/memory/bed1/qemu.slice/101.scope/memory.usage_in_bytes": "999\n",
	}
	for _, tc := range []struct {
		name   string
		lxc    bool
		parent string
		// ctDir is NodeReader.ContainerCgroups under the test's root
		ctDir string
		files map[string]string
		nics  int
		want  sandbox.VMStats
	}{
		{"cgroup v2", false, "", "", map[string]string{
			"cg/qemu.slice/101.scope/cgroup.procs":   "4242\n",
			"cg/qemu.slice/101.scope/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
			"cg/qemu.slice/101.scope/memory.current": "1048576\n",
			"cg/qemu.slice/101.scope/memory.peak":    "2097152\n",
			"cg/qemu.slice/101.scope/memory.events":  "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
			"cg/qemu.slice/101.scope/io.stat":        "253:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n8:0 rbytes=1 wbytes=1\n",
		}, 2, sandbox.VMStats{CPUSeconds: 2.5, MemoryBytes: 1 << 20, MemoryPeakBytes: 2 << 20, OOMKills: 1, DiskReadBytes: 4097, DiskWriteBytes: 8193,
			NetBytesFromGuest: 1100, NetBytesToGuest: 2200, NetPacketsFromGuest: 11, NetPacketsToGuest: 22}},
		{"hybrid v1 under a bed's parent", false, "bed1", "", map[string]string{
			"cg/unified/bed1/qemu.slice/101.scope/cgroup.procs":                  "",
			"cg/unified/bed1/qemu.slice/101.scope/cpu.stat":                      "usage_usec 1000000\n",
			"cg/memory/bed1/qemu.slice/101.scope/memory.usage_in_bytes":          "4096\n",
			"cg/memory/bed1/qemu.slice/101.scope/memory.max_usage_in_bytes":      "8192\n",
			"cg/memory/bed1/qemu.slice/101.scope/memory.oom_control":             "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
			"cg/blkio/bed1/qemu.slice/101.scope/blkio.throttle.io_service_bytes": "8:0 Read 10\n8:0 Write 20\n8:0 Total 30\nTotal 30\n",
			"cg/cpuacct/bed1/qemu.slice/101.scope/cpuacct.usage":                 "7000000000\n",
		}, 1, sandbox.VMStats{CPUSeconds: 1, MemoryBytes: 4096, MemoryPeakBytes: 8192, OOMKills: 4, DiskReadBytes: 10, DiskWriteBytes: 20,
			NetBytesFromGuest: 100, NetBytesToGuest: 200, NetPacketsFromGuest: 1, NetPacketsToGuest: 2}},
		{"no scope, no taps", false, "", "", map[string]string{"cg/qemu.slice/.keep": ""}, 1, sandbox.VMStats{Missing: []string{"cgroup", "taps"}}},
		// a VM without any NIC (no_network) has no tap to miss
		{"no scope, a VM of no NIC", false, "", "", map[string]string{"cg/qemu.slice/.keep": ""}, 0, sandbox.VMStats{Missing: []string{"cgroup"}}},
		{name: "container, cgroup v2", lxc: true, files: map[string]string{
			"cg/lxc/101/cgroup.procs":      "",
			"cg/lxc/101/cpu.stat":          "usage_usec 500000\n",
			"cg/lxc/101/memory.current":    "12582912\n",
			"cg/lxc/101/memory.peak":       "16777216\n",
			"cg/lxc/101/memory.events":     "oom 2\noom_kill 2\n",
			"cg/lxc/101/io.stat":           "253:0 rbytes=512 wbytes=1024\n",
			"cg/lxc/101/ns/cgroup.procs":   "4242\n",
			"cg/lxc/101/ns/memory.current": "1\n",
		}, nics: 1, want: sandbox.VMStats{CPUSeconds: 0.5, MemoryBytes: 12 << 20, MemoryPeakBytes: 16 << 20, OOMKills: 2, DiskReadBytes: 512, DiskWriteBytes: 1024,
			NetBytesFromGuest: 300, NetBytesToGuest: 400, NetPacketsFromGuest: 3, NetPacketsToGuest: 4}},
		{name: "container, hybrid v1 under a bed's parent", lxc: true, parent: "bed1", files: map[string]string{
			"cg/unified/bed1/lxc/101/cgroup.procs":                            "",
			"cg/unified/bed1/lxc/101/cpu.stat":                                "usage_usec 3000000\n",
			"cg/memory/bed1/lxc/101/memory.usage_in_bytes":                    "8192\n",
			"cg/memory/bed1/lxc/101/memory.max_usage_in_bytes":                "16384\n",
			"cg/memory/bed1/lxc/101/memory.oom_control":                       "oom_kill_disable 0\noom_kill 1\n",
			"cg/blkio/bed1/lxc/101/blkio.throttle.io_service_bytes_recursive": "8:0 Read 5\n8:0 Write 6\nTotal 11\n",
			"cg/blkio/bed1/lxc/101/blkio.throttle.io_service_bytes":           "Total 0\n",
		}, nics: 2, want: sandbox.VMStats{CPUSeconds: 3, MemoryBytes: 8192, MemoryPeakBytes: 16384, OOMKills: 1, DiskReadBytes: 5, DiskWriteBytes: 6,
			NetBytesFromGuest: 300, NetBytesToGuest: 400, NetPacketsFromGuest: 3, NetPacketsToGuest: 4}},
		{name: "container, [api] container_cgroups elsewhere", lxc: true, ctDir: "bind/lxc", files: map[string]string{
			"bind/lxc/101/cgroup.procs":   "",
			"bind/lxc/101/memory.current": "4096\n",
		}, nics: 1, want: sandbox.VMStats{MemoryBytes: 4096,
			NetBytesFromGuest: 300, NetBytesToGuest: 400, NetPacketsFromGuest: 3, NetPacketsToGuest: 4}},
		{name: "container, none", lxc: true, files: map[string]string{"cg/lxc/.keep": ""}, nics: 1, want: sandbox.VMStats{Missing: []string{"cgroup", "veths"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.files)
			if tc.want.Missing == nil {
				write(t, root, taps)
				write(t, root, veths)
			}
			r := sandbox.NodeReader{CgroupRoot: filepath.Join(root, "cg"), Parent: tc.parent, NetRoot: filepath.Join(root, "net")}
			if tc.ctDir != "" {
				r.ContainerCgroups = filepath.Join(root, tc.ctDir)
			}
			read, what := r.VMStats, "VMStats"
			if tc.lxc {
				write(t, root, decoys)
				read, what = r.CTStats, "CTStats"
			}
			if got := read(101, tc.nics); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s:\n got %+v\nwant %+v", what, got, tc.want)
			}
		})
	}
}
