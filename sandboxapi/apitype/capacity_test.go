package apitype

import "testing"

func TestCapacityFits(t *testing.T) {
	one := CapacityUse{VMs: 1, VCPUs: 1, MemoryMiB: 1024}
	tests := []struct {
		name  string
		c     Capacity
		shape CapacityUse
		want  int
	}{
		{"unlimited", Capacity{Free: CapacityUse{-1, -1, -1, -1}}, one, -1},
		{"sandboxes bound", Capacity{Free: CapacityUse{3, -1, -1, -1}}, one, 3},
		{"cores bound", Capacity{Free: CapacityUse{10, -1, 5, -1}}, CapacityUse{VMs: 2, VCPUs: 2, MemoryMiB: 512}, 2},
		{"memory bound", Capacity{Free: CapacityUse{-1, -1, -1, 3000}}, one, 2},
		{"vms bound", Capacity{Free: CapacityUse{-1, 5, -1, -1}}, CapacityUse{VMs: 2, VCPUs: 1, MemoryMiB: 16}, 2},
		{"full", Capacity{Free: CapacityUse{0, 4, 4, 4096}}, one, 0},
		{"no room for one", Capacity{Free: CapacityUse{4, 4, 4, 1000}}, one, 0},
		{"over a sandbox cap", Capacity{Free: CapacityUse{-1, -1, -1, -1}, Sandbox: SandboxCaps{VCPUs: 2}}, CapacityUse{VMs: 1, VCPUs: 3, MemoryMiB: 16}, 0},
		{"at a sandbox cap", Capacity{Free: CapacityUse{2, -1, -1, -1}, Sandbox: SandboxCaps{VCPUs: 2}}, CapacityUse{VMs: 1, VCPUs: 2, MemoryMiB: 16}, 2},
	}
	for _, tc := range tests {
		if got := tc.c.Fits(tc.shape); got != tc.want {
			t.Errorf("%s: Fits = %d, want %d", tc.name, got, tc.want)
		}
	}
}
