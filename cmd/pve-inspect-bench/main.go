// Command pve-inspect-bench measures pve-inspect against its baselines,
// side by side in one run, on the test bed (needs root). `make bench` runs
// it; each section prints its own figures and ratios.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// section is one benchmark group.
type section struct {
	name string
	run  func(ctx context.Context, cfg config) error
}

// config holds the command's flags.
type config struct {
	only  map[string]bool
	quick bool
	// scaleSizes and cpuProfile tune section scale (bench/scale).
	scaleSizes string
	cpuProfile string
}

func main() {
	var only string
	cfg := config{}
	flag.StringVar(&only, "only", "", "comma-separated sections to run (default: all)")
	flag.BoolVar(&cfg.quick, "quick", false, "smaller sizes and fewer rounds")
	flag.StringVar(&cfg.scaleSizes, "scale-sizes", "", "comma-separated bridge counts of section scale (default 1,500,2000)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "section scale: write a CPU profile of the largest size's burst of new bridges here")
	flag.Parse()
	if only != "" {
		cfg.only = map[string]bool{}
		for _, s := range strings.Split(only, ",") {
			cfg.only[strings.TrimSpace(s)] = true
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pve-inspect-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	host, _ := os.Hostname()
	fmt.Printf("# pve-inspect bench: %s, %d CPUs, %s, %s\n", host, runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	for _, s := range sections() {
		if cfg.only != nil && !cfg.only[s.name] {
			continue
		}
		fmt.Printf("\n## %s\n", s.name)
		if err := s.run(ctx, cfg); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.IndexByte(l, ':'); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return "unknown CPU"
}
