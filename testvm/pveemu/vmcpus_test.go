package pveemu

import "testing"

// TestVMCPUs: the CPU time the bed gives a guest is what the VM's vCPU
// threads can run (sockets x cores, or fewer vcpus), at most cpulimit.
func TestVMCPUs(t *testing.T) {
	for _, c := range []struct {
		conf map[string]string
		want float64
	}{
		{map[string]string{}, 1},
		{map[string]string{"cores": "2"}, 2},
		{map[string]string{"cores": "2", "sockets": "2"}, 4},
		{map[string]string{"cores": "4", "vcpus": "2"}, 2},
		{map[string]string{"cores": "2", "vcpus": "8"}, 2},
		{map[string]string{"cores": "4", "cpulimit": "1.5"}, 1.5},
		{map[string]string{"cores": "1", "cpulimit": "3"}, 1},
		{map[string]string{"cores": "2", "cpulimit": "0"}, 2},
	} {
		if got := vmCPUs(c.conf); got != c.want {
			t.Errorf("vmCPUs(%v) = %v, want %v", c.conf, got, c.want)
		}
	}
}
