package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// BenchmarkBed measures, in one run on the bed with real qemu-ga: exec
// round trip through the HTTP API against the raw guest agent client on the
// same VM, and 64 MiB write+read through the API against the client.
func BenchmarkBed(b *testing.B) {
	testkit.RequireRoot(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	e := newBedEnv(b, ctx, nil)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		b.Fatal(err)
	}
	raw := qga.New(qga.Options{}).Agent(filepath.Join(e.bed.QGADir(), strconv.Itoa(sb.VMs[0].VMID)+".qga"))
	b.Run("exec/api", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exec/qga", func(b *testing.B) {
		for b.Loop() {
			if _, err := raw.Exec(ctx, qga.ExecRequest{Argv: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	var buf bytes.Buffer
	b.Run("file64MiB/api", func(b *testing.B) {
		b.SetBytes(2 << 26)
		for b.Loop() {
			if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/b", bytes.NewReader(data), int64(len(data)), 0); err != nil {
				b.Fatal(err)
			}
			buf.Reset()
			if _, err := e.c.ReadFile(ctx, sb.ID, "vm0", "/root/b", &buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("file64MiB/qga", func(b *testing.B) {
		b.SetBytes(2 << 26)
		for b.Loop() {
			if err := raw.WriteFile(ctx, "/root/b", bytes.NewReader(data), 0o644); err != nil {
				b.Fatal(err)
			}
			buf.Reset()
			if _, err := raw.ReadFile(ctx, "/root/b", &buf, 1<<30); err != nil {
				b.Fatal(err)
			}
		}
	})
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		b.Fatal(err)
	}
}
