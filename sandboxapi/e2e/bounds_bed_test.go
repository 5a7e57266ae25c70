package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// countWriter counts bytes and checks they are all zero.
type countWriter struct {
	n       int64
	nonzero bool
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	if !c.nonzero && bytes.ContainsFunc(p, func(r rune) bool { return r != 0 }) {
		c.nonzero = true
	}
	return len(p), nil
}

// procStatusKiB reads a kB field of /proc/self/status.
func procStatusKiB(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", field, err)
			}
			return n
		}
	}
	t.Fatalf("%s not in /proc/self/status", field)
	return 0
}

// TestBedExec200MiB: a real guest writes 200 MiB to stdout. Collected into
// one answer it is refused before anything runs (the cap is 64 MiB per
// stream); streamed it arrives whole, and the peak resident memory of the
// process serving it (the API server, the emulator and this client) grows
// by less than the collected cap while it flows.
func TestBedExec200MiB(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	const size = 200 << 20
	req := apitype.ExecRequest{Argv: []string{"head", "-c", strconv.Itoa(size), "/dev/zero"}, OutputLimit: size + 1}
	_, err = e.c.Exec(ctx, sb.ID, "vm0", req)
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || p.Field != "output_limit" {
		t.Fatalf("collected 200 MiB exec: %v, want refused on output_limit", err)
	}

	// Peak RSS is reset (clear_refs 5) so VmHWM measures this exec alone.
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset peak RSS: %v", err)
	}
	base := procStatusKiB(t, "VmHWM")
	var out countWriter
	var errb bytes.Buffer
	res, err := e.c.ExecStream(ctx, sb.ID, "vm0", req, &out, &errb)
	if err != nil || res.ExitCode != 0 || res.StdoutTruncated {
		t.Fatalf("streamed exec: %+v %v (stderr %q)", res, err, errb.String())
	}
	if out.n != size || out.nonzero {
		t.Fatalf("streamed %d bytes (nonzero %v), want %d zero bytes", out.n, out.nonzero, size)
	}
	peak := procStatusKiB(t, "VmHWM")
	growth := (peak - base) << 10
	t.Logf("peak RSS %d KiB before, %d KiB during the 200 MiB stream (+%d MiB)", base, peak, growth>>20)
	if growth >= 64<<20 {
		t.Errorf("peak RSS grew by %d MiB while streaming 200 MiB; want under the 64 MiB collected cap", growth>>20)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(fmt.Errorf("delete: %w", err))
	}
}
