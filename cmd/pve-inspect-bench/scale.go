package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/bench/scale"
)

// benchScale measures the guard's per-change paths at 1, 500 and 2000
// bridges (bench/scale).
func benchScale(ctx context.Context, cfg config) error {
	o := scale.Options{Out: os.Stdout, CPUProfile: cfg.cpuProfile,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if cfg.quick {
		o.Singles, o.Changes = 10, 10
	}
	for _, f := range strings.Split(cfg.scaleSizes, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return fmt.Errorf("-scale-sizes: %q is not a positive count", f)
		}
		o.Sizes = append(o.Sizes, n)
	}
	_, err := scale.Run(ctx, o)
	return err
}
