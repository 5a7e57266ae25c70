package main

import (
	"context"
	"os"

	guardbench "github.com/pve-inspect/pve-inspect/firewall/bench"
	"github.com/pve-inspect/pve-inspect/testvm/egressbench"
)

func sections() []section {
	return []section{
		{"guard", benchGuard},
		{"layer2", benchLayer2},
		{"lockdown", benchLockdown},
		{"qga", benchQGA},
		{"api", benchAPI},
		{"egress", benchEgress},
		{"scale", benchScale},
	}
}

func benchGuard(ctx context.Context, cfg config) error {
	o := guardbench.Options{}
	if cfg.quick {
		o.Rounds, o.RouteChanges = 3, 10
	}
	_, err := guardbench.Run(ctx, o, os.Stdout)
	return err
}

func benchLayer2(ctx context.Context, cfg config) error {
	o := guardbench.Layer2Options{}
	if cfg.quick {
		o.Rounds, o.Updates = 3, 20
	}
	_, err := guardbench.RunLayer2(ctx, o, os.Stdout)
	return err
}

func benchEgress(ctx context.Context, cfg config) error {
	o := egressbench.Options{}
	if cfg.quick {
		o.Rounds = 5
	}
	_, err := egressbench.Run(ctx, o, os.Stdout)
	return err
}
