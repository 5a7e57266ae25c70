package cmd

import (
	"context"
	"testing"

	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

func TestBuild(t *testing.T) {
	p, err := sysbox.EnsureRootfs(context.Background(), sysbox.RootfsOptions{Packages: []string{"init-system-helpers", "iptables", "nftables"}})
	t.Log(p, err)
}
