package cmd

import (
	"context"
	"testing"

	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

func TestBuild(t *testing.T) {
	p, err := sysbox.EnsureRootfs(context.Background(), sysbox.RootfsOptions{Suite: "trixie", Packages: []string{"init-system-helpers", "iproute2", "iptables", "nftables"}})
	t.Log(p, err)
}
