package qga

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
)

// startGuest brings up a one-guest bed for the test and returns the
// guest's agent socket and a scratch directory in the guest.
func startGuest(tb testing.TB) (socket, dir string) {
	tb.Helper()
	testkit.RequireRoot(tb, "qemu-ga", "dnsmasq", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, g, err := bench.OneGuestBed(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("close test bed: %v", err)
		}
	})
	dir = "/var/tmp/qgabench" + strconv.Itoa(g.VMID)
	res, err := qga.New(qga.Options{}).Agent(g.Socket).Exec(ctx, qga.ExecRequest{Argv: []string{"mkdir", "-p", dir}})
	if err != nil || res.ExitCode != 0 {
		tb.Fatalf("guest scratch dir: %v %+v", err, res)
	}
	return g.Socket, dir
}

// TestBenchRun runs the bench report once with a small size so that `make
// bench` cannot rot unnoticed. QGA_BENCH_SIZES (MiB, comma separated)
// selects other sizes, e.g. QGA_BENCH_SIZES=1,64,512 go test -run BenchRun -v.
func TestBenchRun(t *testing.T) {
	socket, _ := startGuest(t)
	sizes := []int64{1 << 20}
	if s := os.Getenv("QGA_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, n<<20)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, &out, socket, sizes); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if !strings.Contains(out.String(), "exec true") || !strings.Contains(out.String(), "write") {
		t.Fatalf("report incomplete:\n%s", out.String())
	}
}

func benchData(b *testing.B, size int) []byte {
	data := make([]byte, size)
	rand.Read(data)
	b.SetBytes(int64(size))
	return data
}

// The baselines alone, as Go benchmarks; qga's own benchmarks
// (qga/bench_test.go) time the client on the same sizes.

func BenchmarkRawWrite(b *testing.B) {
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(strconv.Itoa(size>>20)+"MiB", func(b *testing.B) {
			socket, dir := startGuest(b)
			data := benchData(b, size)
			for b.Loop() {
				if err := RawWrite(context.Background(), socket, dir+"/f", bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRefWrite(b *testing.B) {
	socket, dir := startGuest(b)
	data := benchData(b, 1<<20)
	for b.Loop() {
		if err := RefWrite(context.Background(), socket, dir+"/f", bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawExecTrue(b *testing.B) {
	socket, _ := startGuest(b)
	for b.Loop() {
		if err := RawExec(context.Background(), socket, time.Millisecond); err != nil {
			b.Fatal(err)
		}
	}
}
