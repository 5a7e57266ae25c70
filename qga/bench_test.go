package qga_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/qga"
	qgabench "github.com/pve-inspect/pve-inspect/bench/qga"
)

// TestBenchRun runs the bench report once with a small size so that `make
// bench` cannot rot unnoticed. QGA_BENCH_SIZES (MiB, comma separated)
// selects other sizes, e.g. QGA_BENCH_SIZES=1,64,512 go test -run BenchRun -v.
func TestBenchRun(t *testing.T) {
	socket, _ := qga.StartTestGuest(t)
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
	if err := qgabench.Run(ctx, &out, socket, sizes); err != nil {
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

func BenchmarkWriteFile(b *testing.B) {
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(strconv.Itoa(size>>20)+"MiB", func(b *testing.B) {
			socket, dir := qga.StartTestGuest(b)
			a := qga.New(qga.Options{}).Agent(socket)
			data := benchData(b, size)
			for b.Loop() {
				if err := a.WriteFile(context.Background(), dir+"/f", bytes.NewReader(data), 0o644); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRawWrite(b *testing.B) {
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(strconv.Itoa(size>>20)+"MiB", func(b *testing.B) {
			socket, dir := qga.StartTestGuest(b)
			data := benchData(b, size)
			for b.Loop() {
				if err := qgabench.RawWrite(context.Background(), socket, dir+"/f", bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRefWrite(b *testing.B) {
	socket, dir := qga.StartTestGuest(b)
	data := benchData(b, 1<<20)
	for b.Loop() {
		if err := qgabench.RefWrite(context.Background(), socket, dir+"/f", bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFile(b *testing.B) {
	for _, size := range []int{1 << 20, 64 << 20} {
		b.Run(strconv.Itoa(size>>20)+"MiB", func(b *testing.B) {
			socket, dir := qga.StartTestGuest(b)
			a := qga.New(qga.Options{}).Agent(socket)
			data := benchData(b, size)
			if err := a.WriteFile(context.Background(), dir+"/f", bytes.NewReader(data), 0o644); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := a.ReadFile(context.Background(), dir+"/f", io.Discard, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkExecTrue(b *testing.B) {
	socket, _ := qga.StartTestGuest(b)
	a := qga.New(qga.Options{}).Agent(socket)
	for b.Loop() {
		res, err := a.Exec(context.Background(), qga.ExecRequest{Argv: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}

func BenchmarkRawExecTrue(b *testing.B) {
	socket, _ := qga.StartTestGuest(b)
	for b.Loop() {
		if err := qgabench.RawExec(context.Background(), socket, time.Millisecond); err != nil {
			b.Fatal(err)
		}
	}
}
