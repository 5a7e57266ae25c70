// Command pve-inspect-bench measures pve-inspect against its baselines,
// side by side in one run, on the test bed (needs root). `make bench` runs
// it; each section prints its own figures and ratios. The sections live
// under bench/, one package each, listed in sections.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
)

// config holds the command's flags.
type config struct {
	only  []string // sections to run; nil = all
	quick bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pve-inspect-bench:", err)
		os.Exit(1)
	}
}

// parseFlags reads the flags; an unknown section in -only is an error.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	var only string
	fs := flag.NewFlagSet("pve-inspect-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&only, "only", "", "comma-separated sections to run (default: all)")
	fs.BoolVar(&cfg.quick, "quick", false, "smaller sizes and fewer rounds in every section")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: pve-inspect-bench [-only SECTION,...] [-quick]\n\nSections, in the order they run:\n")
		for _, s := range sections {
			fmt.Fprintf(fs.Output(), "  %-9s %s\n", s.name, s.about)
		}
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pve-inspect-bench: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return cfg, errors.New("unexpected arguments")
	}
	if only != "" {
		for _, name := range strings.Split(only, ",") {
			name = strings.TrimSpace(name)
			if !slices.ContainsFunc(sections, func(s section) bool { return s.name == name }) {
				fmt.Fprintf(stderr, "pve-inspect-bench: -only: no section %q\n", name)
				fs.Usage()
				return cfg, fmt.Errorf("no section %q", name)
			}
			cfg.only = append(cfg.only, name)
		}
	}
	return cfg, nil
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	host, _ := os.Hostname()
	fmt.Fprintf(out, "# pve-inspect bench: %s, %d CPUs, %s, %s\n", host, runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	for _, s := range sections {
		if cfg.only != nil && !slices.Contains(cfg.only, s.name) {
			continue
		}
		fmt.Fprintf(out, "\n## %s\n", s.name)
		if err := s.run(ctx, bench.Config{Quick: cfg.quick, Out: out}); err != nil {
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
