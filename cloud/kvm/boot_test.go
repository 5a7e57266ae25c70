package kvm

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/pve-inspect/pve-inspect/cloud/kvm/internal/seedcheck"
)

// TestSeedcheckReadsSeed checks, on the host, the reader the guest init
// uses: the digest it computes from our ISO is the digest of what we wrote.
func TestSeedcheckReadsSeed(t *testing.T) {
	iso := filepath.Join(t.TempDir(), "seed.iso")
	ud, md := []byte("#cloud-config\n{}\n"), MetaData("tcg-1", "tcg")
	if err := WriteSeedISO(iso, Seed{UserData: ud, MetaData: md}); err != nil {
		t.Fatal(err)
	}
	got, err := seedcheck.Read(iso)
	if err != nil {
		t.Fatal(err)
	}
	if want := seedcheck.Summary(SeedLabel, ud, md); got != want {
		t.Errorf("read %q, want %q", got, want)
	}
	if _, err := seedcheck.Read("/dev/null"); err == nil {
		t.Error("/dev/null read as a seed")
	}
}

// kernelModules resolves the named modules and their dependencies from
// /lib/modules/<ver>/modules.dep (built-in ones are skipped) and returns
// them decompressed, with their load order.
func kernelModules(t *testing.T, ver string, names ...string) (map[string][]byte, []string) {
	base := filepath.Join("/lib/modules", ver)
	norm := func(p string) string {
		b := filepath.Base(p)
		for _, ext := range []string{".xz", ".zst", ".gz"} {
			b = strings.TrimSuffix(b, ext)
		}
		return strings.ReplaceAll(strings.TrimSuffix(b, ".ko"), "-", "_")
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(base, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[norm(l)] = true
		}
	}
	deps := map[string][]string{}
	paths := map[string]string{}
	b, err := os.ReadFile(filepath.Join(base, "modules.dep"))
	if err != nil {
		t.Logf("no %s/modules.dep (%v): assuming the drivers are built in", base, err)
		return nil, nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n := norm(mod)
		paths[n] = mod
		for _, d := range strings.Fields(rest) {
			deps[n] = append(deps[n], norm(d))
			paths[norm(d)] = d
		}
	}
	out := map[string][]byte{}
	var order []string
	seen := map[string]bool{}
	var visit func(n string)
	visit = func(n string) {
		if seen[n] || builtin[n] {
			return
		}
		seen[n] = true
		p, ok := paths[n]
		if !ok {
			t.Fatalf("module %s: neither built in nor in modules.dep", n)
		}
		for _, d := range deps[n] {
			visit(d)
		}
		out[n+".ko"] = readModule(t, filepath.Join(base, p))
		order = append(order, n+".ko")
	}
	for _, n := range names {
		visit(n)
	}
	return out, order
}

func readModule(t *testing.T, p string) []byte {
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var r io.Reader
	switch {
	case strings.HasSuffix(p, ".xz"):
		r, err = xz.NewReader(bytes.NewReader(raw))
	case strings.HasSuffix(p, ".zst"):
		var z *zstd.Decoder
		z, err = zstd.NewReader(bytes.NewReader(raw))
		r = z
	case strings.HasSuffix(p, ".gz"):
		r, err = gzip.NewReader(bytes.NewReader(raw))
	default:
		return raw
	}
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return b
}

// writeInitramfs writes a cpio (newc) archive: the init, the modules and
// the mount points.
func writeInitramfs(t *testing.T, path, initBin string, mods map[string][]byte, order []string) {
	var buf bytes.Buffer
	ino := 1
	entry := func(name string, mode uint32, rmajor, rminor int, data []byte) {
		fmt.Fprintf(&buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
		ino++
		buf.WriteString(name + "\x00")
		for buf.Len()%4 != 0 {
			buf.WriteByte(0)
		}
		buf.Write(data)
		for buf.Len()%4 != 0 {
			buf.WriteByte(0)
		}
	}
	const dir, reg, chr = 0o040000, 0o100000, 0o020000
	for _, d := range []string{"dev", "proc", "sys", "modules"} {
		entry(d, dir|0o755, 0, 0, nil)
	}
	entry("dev/console", chr|0o600, 5, 1, nil)
	init, err := os.ReadFile(initBin)
	if err != nil {
		t.Fatal(err)
	}
	entry("init", reg|0o755, 0, 0, init)
	for _, m := range order {
		entry("modules/"+m, reg|0o644, 0, 0, mods[m])
	}
	entry("modules/order", reg|0o644, 0, 0, []byte(strings.Join(order, "\n")+"\n"))
	entry("TRAILER!!!", 0, 0, 0, nil)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
