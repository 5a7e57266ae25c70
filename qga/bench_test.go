package qga_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"strconv"
	"testing"

	"github.com/pve-inspect/pve-inspect/qga"
)

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
