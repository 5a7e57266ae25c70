package templatebuild

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

// TarMember is a member of a test archive (TarXZ; exported for the
// package's external tests).
type TarMember struct {
	Name string
	// Type is the tar type (tar.TypeReg when 0).
	Type byte
	Data []byte
	Link string
	// Size is the header's size when set (a header larger than Data).
	Size int64
}

// TarXZ is a .tar.xz of members, written by the xz writer with cfg.
func TarXZ(t testing.TB, cfg xz.WriterConfig, members ...TarMember) []byte {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, e := range members {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: 0o644, Size: int64(len(e.Data)), Linkname: e.Link}
		if e.Type == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if e.Size != 0 {
			h.Size = e.Size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Data); err != nil && !errors.Is(err, tar.ErrWriteTooLong) {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil && len(members) > 0 && members[len(members)-1].Size == 0 {
		t.Fatal(err)
	}
	var out bytes.Buffer
	zw, err := cfg.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(tb.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// withDict is a one-block xz stream xzb with its LZMA2 dictionary
// property set to p (the block header's CRC32 made again).
func withDict(t testing.TB, xzb []byte, p byte) []byte {
	t.Helper()
	b := bytes.Clone(xzb)
	hlen := (int(b[12]) + 1) * 4
	h := b[12 : 12+hlen]
	if h[1] != 0 || h[2] != 0x21 || h[3] != 1 {
		t.Fatalf("block header % x: want one LZMA2 filter and no sizes", h)
	}
	h[4] = p
	binary.LittleEndian.PutUint32(h[hlen-4:], crc32.ChecksumIEEE(h[:hlen-4]))
	return b
}

// take is unpackMember's take that reads the member and keeps it.
type take struct {
	n    int
	size int64
	data []byte
}

func (k *take) fn(size int64, r io.Reader) error {
	k.n++
	k.size = size
	b, err := io.ReadAll(io.LimitReader(r, size+1))
	k.data = b
	if err != nil || int64(len(b)) != size {
		return fmt.Errorf("the member is not its size (%d bytes read): %v", len(b), err)
	}
	return nil
}

// TestUnpackMember: the member disk.raw of a .tar.xz is handed over as it
// is (beside a directory and other files, from a multi-block stream of
// each check type, as a sparse member of GNU tar's two formats); every
// archive a hostile or broken server could send is refused, before the
// member is taken or, for what comes after it, at the end.
func TestUnpackMember(t *testing.T) {
	disk := bytes.Repeat([]byte("kali-disk "), 4000)
	other := []byte("readme")
	good := []TarMember{{Name: "./", Type: tar.TypeDir}, {Name: "README", Data: other}, {Name: "./disk.raw", Data: disk}}
	lim := archiveLimits{Member: 1 << 20, Unpacked: 2 << 20}
	small := TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw", Data: disk})
	for _, tc := range []struct {
		name    string
		archive []byte
		lim     archiveLimits
		// want is the member taken ("" none), wantErr the refusal ("" none)
		want, wantErr string
		// taken is whether the member was handed over before the refusal
		taken bool
	}{
		{name: "good", archive: TarXZ(t, xz.WriterConfig{}, good...), want: string(disk)},
		{name: "blocks crc32", archive: TarXZ(t, xz.WriterConfig{BlockSize: 4096, CheckSum: xz.CRC32}, good...), want: string(disk)},
		{name: "blocks sha256", archive: TarXZ(t, xz.WriterConfig{BlockSize: 5000, CheckSum: xz.SHA256}, good...), want: string(disk)},
		{name: "no check", archive: TarXZ(t, xz.WriterConfig{NoCheckSum: true}, good...), want: string(disk)},
		{name: "two streams", archive: append(append(TarXZ(t, xz.WriterConfig{}, good[:2]...), 0, 0, 0, 0), TarXZ(t, xz.WriterConfig{}, good[2])...), wantErr: `holds no "disk.raw"`},
		{name: "dot-dot", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "../disk.raw", Data: disk}), wantErr: `a member "../disk.raw" outside`},
		{name: "dot-dot inside", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "a/../../disk.raw", Data: disk}), wantErr: "outside"},
		{name: "absolute", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "/disk.raw", Data: disk}), wantErr: "outside"},
		{name: "after the member", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw", Data: disk}, TarMember{Name: "../x", Data: other}), wantErr: "outside", taken: true},
		{name: "symlink", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw", Type: tar.TypeSymlink, Link: "/dev/sda"}), wantErr: `"disk.raw" is of tar type "2"`},
		{name: "hard link", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "x", Data: disk}, TarMember{Name: "disk.raw", Type: tar.TypeLink, Link: "x"}), wantErr: "a link, device or fifo"},
		{name: "device", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw", Type: tar.TypeBlock}), wantErr: "a link, device or fifo"},
		{name: "fifo elsewhere", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "p", Type: tar.TypeFifo}, TarMember{Name: "disk.raw", Data: disk}), wantErr: "a link, device or fifo"},
		{name: "a directory of the name", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw/", Type: tar.TypeDir}), wantErr: "is not a file"},
		{name: "none", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.qcow2", Data: disk}), wantErr: `holds no "disk.raw"`},
		{name: "empty", archive: TarXZ(t, xz.WriterConfig{}), wantErr: `holds no "disk.raw"`},
		{name: "twice", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw", Data: disk}, TarMember{Name: "./disk.raw", Data: other}), wantErr: "twice", taken: true},
		{name: "member too large", archive: small, lim: archiveLimits{Member: int64(len(disk)) - 1, Unpacked: 1 << 20}, wantErr: "want 1 to 39999"},
		{name: "stream too large", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "pad", Data: make([]byte, 1<<20)}, TarMember{Name: "disk.raw", Data: disk}), lim: archiveLimits{Member: 1 << 20, Unpacked: 1 << 20}, wantErr: "unpacks to more than 1048576 bytes"},
		{name: "a header larger than its data", archive: TarXZ(t, xz.WriterConfig{}, TarMember{Name: "disk.raw", Size: 1 << 19}), wantErr: "image archive refused"},
		{name: "truncated", archive: small[:len(small)/2], wantErr: "image archive refused"},
		{name: "truncated at the index", archive: small[:len(small)-20], wantErr: "image archive refused", taken: true},
		{name: "corrupt", archive: flip(small, len(small)/2), wantErr: "image archive refused"},
		{name: "not xz", archive: []byte("PK\x03\x04 a zip"), wantErr: "not an xz stream"},
		{name: "gzip", archive: []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3}, wantErr: "not an xz stream"},
		{name: "a 4 GiB dictionary", archive: withDict(t, small, 40), wantErr: "dictionary is 4095 MiB, more than the 64 MiB"},
		{name: "a 96 MiB dictionary", archive: withDict(t, small, 29), wantErr: "dictionary is 96 MiB"},
		{name: "a 64 MiB dictionary", archive: withDict(t, small, 28), want: string(disk)},
		{name: "a bad dictionary property", archive: withDict(t, small, 41), wantErr: "dictionary size property"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.lim == (archiveLimits{}) {
				tc.lim = lim
			}
			var k take
			err := unpackMember(bytes.NewReader(tc.archive), "disk.raw", tc.lim, k.fn)
			if tc.wantErr == "" {
				if err != nil || k.n != 1 || string(k.data) != tc.want {
					t.Fatalf("%v, taken %d times (%d bytes)", err, k.n, len(k.data))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%v, want %q", err, tc.wantErr)
			}
			if tc.taken != (k.n == 1 && string(k.data) == string(disk)) {
				t.Errorf("member taken %d times (%d bytes), want taken %v", k.n, len(k.data), tc.taken)
			}
		})
	}
}

// TestXZGuardBlocks: the guard passes a stream of as many blocks as it
// allows, and fails the read that brings one more; a second stream counts
// its own.
func TestXZGuardBlocks(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 1000) // 16000 bytes: 4 blocks of 4096
	one := TarXZ(t, xz.WriterConfig{BlockSize: 4096}, TarMember{Name: "disk.raw", Data: data})
	blocks := 0
	for n := 1; n < 10; n++ {
		if _, err := io.Copy(io.Discard, newXZGuard(bytes.NewReader(one), maxXZDict, n, xzDictSlack)); err == nil {
			blocks = n
			break
		} else if !strings.Contains(err.Error(), "a stream of more than") {
			t.Fatalf("%d blocks: %v", n, err)
		}
	}
	if blocks < 4 {
		t.Fatalf("a stream of %d blocks passes, want at least 4 (16 KiB of tar in blocks of 4 KiB)", blocks)
	}
	two := append(bytes.Clone(one), one...)
	if _, err := io.Copy(io.Discard, newXZGuard(bytes.NewReader(two), maxXZDict, blocks, xzDictSlack)); err != nil {
		t.Errorf("two streams of %d blocks each: %v", blocks, err)
	}
}

// tinyBlocks is a valid xz stream (check none) of data in blocks of at
// most per bytes, each one uncompressed LZMA2 chunk, each block header
// declaring the LZMA2 dictionary property p: what a hostile server can
// send to have the decoder allocate p's dictionary for every 20 bytes.
func tinyBlocks(data []byte, per int, p byte) []byte {
	le := binary.LittleEndian
	var out bytes.Buffer
	flags := []byte{0, 0}
	out.Write(xzMagic)
	out.Write(flags)
	out.Write(le.AppendUint32(nil, crc32.ChecksumIEEE(flags)))
	idx := []byte{0}
	var records []byte
	blocks := 0
	for len(data) > 0 {
		n := min(per, len(data))
		h := []byte{2, 0, lzma2FilterID, 1, p, 0, 0, 0} // 12 bytes: one filter, no sizes
		h = le.AppendUint32(h, crc32.ChecksumIEEE(h))
		body := append([]byte{1, byte((n - 1) >> 8), byte(n - 1)}, data[:n]...)
		body = append(body, 0) // the end of the LZMA2 data
		data = data[n:]
		out.Write(h)
		out.Write(body)
		out.Write(make([]byte, (4-len(body)%4)%4))
		records = binary.AppendUvarint(records, uint64(len(h)+len(body)))
		records = binary.AppendUvarint(records, uint64(n))
		blocks++
	}
	idx = binary.AppendUvarint(idx, uint64(blocks))
	idx = append(idx, records...)
	idx = append(idx, make([]byte, (4-len(idx)%4)%4)...)
	out.Write(idx)
	out.Write(le.AppendUint32(nil, crc32.ChecksumIEEE(idx)))
	foot := le.AppendUint32(nil, uint32((len(idx)+4)/4-1))
	foot = append(foot, flags...)
	out.Write(le.AppendUint32(nil, crc32.ChecksumIEEE(foot)))
	out.Write(foot)
	out.WriteString("YZ")
	return out.Bytes()
}

// TestUnpackMemberDictionaryBudget: the decoder allocates a new
// dictionary for every block, so a valid archive of tiny blocks each
// declaring a 64 MiB dictionary (xz -9's, which the per-block bound
// takes) would have it allocate and zero 64 MiB per 20 bytes read: 4 GiB
// here for a 3 KB archive, 64 GiB for 22 KB. The blocks' dictionaries
// together are bounded by what the archive may unpack to plus
// xzDictSlack: the archive is refused before the decoder allocates past
// that; the same archive with 4 KiB dictionaries is taken.
func TestUnpackMemberDictionaryBudget(t *testing.T) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	disk := bytes.Repeat([]byte("d"), 512)
	if err := tw.WriteHeader(&tar.Header{Name: "disk.raw", Mode: 0o644, Size: int64(len(disk)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(disk); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	lim := archiveLimits{Member: 1 << 20, Unpacked: 2 << 20}
	small := tinyBlocks(tb.Bytes(), 32, 0) // 4 KiB dictionaries
	var k take
	if err := unpackMember(bytes.NewReader(small), "disk.raw", lim, k.fn); err != nil || !bytes.Equal(k.data, disk) {
		t.Fatalf("tiny blocks of 4 KiB dictionaries: %v (%d bytes taken)", err, len(k.data))
	}
	hostile := tinyBlocks(tb.Bytes(), 32, 28) // 64 MiB each, 64 blocks
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	k = take{}
	err := unpackMember(bytes.NewReader(hostile), "disk.raw", lim, k.fn)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes of archive: %d MiB allocated", len(hostile), alloc>>20)
	if err == nil || !errors.Is(err, ErrArchive) || !strings.Contains(err.Error(), "dictionaries sum to more than") {
		t.Errorf("64 blocks of 64 MiB dictionaries in %d bytes: %v, want refused", len(hostile), err)
	}
	if budget := uint64(lim.Unpacked + xzDictSlack); alloc > budget+budget/2 {
		t.Errorf("unpacking %d bytes allocated %d MiB, more than the dictionaries' budget of %d MiB", len(hostile), alloc>>20, budget>>20)
	}
}

func flip(b []byte, at int) []byte {
	b = bytes.Clone(b)
	b[at] ^= 0x55
	return b
}

// TestUnpackMemberFixtures: archives made by GNU tar and xz (XZ Utils
// 5.4), not by this project's writers: a sparse disk.raw in GNU tar's old
// format (tar type S) and its PAX one, and a multi-block stream of xz -T2
// with the blocks' sizes in their headers. Made with:
//
//	truncate -s 4M disk.raw; printf bootsector-head | dd of=disk.raw conv=notrunc
//	printf tail-of-disk | dd of=disk.raw bs=1 seek=$((4*1024*1024-4096)) conv=notrunc
//	tar --sparse --format=gnu -cf - disk.raw | xz -T2 --check=crc32 > sparse-gnu.tar.xz
//	tar --sparse --format=posix -cf - disk.raw | xz --check=sha256 > sparse-pax.tar.xz
//	(a 66666-byte disk.raw of text and random bytes, and a directory sub)
//	tar --format=ustar -cf - sub disk.raw | xz -T2 --block-size=16KiB --check=crc64 > multi.tar.xz
func TestUnpackMemberFixtures(t *testing.T) {
	for file, want := range map[string]string{
		"sparse-gnu.tar.xz": "bc11f3a75656d69e0363c961d7a5accc9c1e3953b276cb01282e3be99493b087",
		"sparse-pax.tar.xz": "bc11f3a75656d69e0363c961d7a5accc9c1e3953b276cb01282e3be99493b087",
		"multi.tar.xz":      "e1052cace6b09ae3f17fe7885dbfaf79b105d55a2d4615628a5f6a01476ec93c",
	} {
		b, err := os.ReadFile("testdata/unpack/" + file)
		if err != nil {
			t.Fatal(err)
		}
		var k take
		if err := unpackMember(bytes.NewReader(b), "disk.raw", archiveLimits{Member: 8 << 20, Unpacked: 8 << 20}, k.fn); err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		if sum := sha256.Sum256(k.data); hex.EncodeToString(sum[:]) != want || k.n != 1 {
			t.Errorf("%s: member of sha256 %x (%d bytes, taken %d times), want %s", file, sum, len(k.data), k.n, want)
		}
	}
}

// FuzzUnpackMember: unpacking never panics, never takes the member twice,
// and returns nil only after taking it once, whole, within its bound.
func FuzzUnpackMember(f *testing.F) {
	disk := bytes.Repeat([]byte("disk "), 300)
	f.Add(TarXZ(f, xz.WriterConfig{}, TarMember{Name: "disk.raw", Data: disk}))
	f.Add(TarXZ(f, xz.WriterConfig{BlockSize: 512, CheckSum: xz.CRC32}, TarMember{Name: "./", Type: tar.TypeDir}, TarMember{Name: "./disk.raw", Data: disk}))
	f.Add(TarXZ(f, xz.WriterConfig{}, TarMember{Name: "disk.raw", Type: tar.TypeSymlink, Link: "/etc/shadow"}))
	for _, file := range []string{"sparse-gnu.tar.xz", "sparse-pax.tar.xz"} {
		if b, err := os.ReadFile("testdata/unpack/" + file); err == nil {
			f.Add(b)
		}
	}
	lim := archiveLimits{Member: 8 << 20, Unpacked: 9 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		var k take
		err := unpackMember(bytes.NewReader(data), "disk.raw", lim, k.fn)
		if k.n > 1 {
			t.Fatalf("member taken %d times", k.n)
		}
		if err == nil && (k.n != 1 || int64(len(k.data)) != k.size || k.size < 1 || k.size > lim.Member) {
			t.Fatalf("nil after taking %d times %d of %d bytes", k.n, len(k.data), k.size)
		}
		if err != nil && !errors.Is(err, ErrArchive) {
			t.Fatalf("an error that is not an archive's refusal: %v", err)
		}
	})
}
