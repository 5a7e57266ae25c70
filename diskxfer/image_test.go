package diskxfer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
)

func TestWriteImageStops(t *testing.T) {
	p := filepath.Join(t.TempDir(), "img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stop := errors.New("guest gone")
	calls := 0
	_, err = writeImage(f, io.LimitReader(rand.NewChaCha8([32]byte{}), 3*blockSize), 3*blockSize, func(int64) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("got %v after %d blocks, want the callback's error after the first", err, calls)
	}
}

func TestImageSize(t *testing.T) {
	for _, tt := range []struct{ size, want int64 }{
		{0, blockSize}, {1, blockSize}, {blockSize, blockSize}, {blockSize + 1, 2 * blockSize}, {1 << 30, 1 << 30},
	} {
		if got := imageSize(tt.size); got != tt.want {
			t.Errorf("imageSize(%d) = %d, want %d", tt.size, got, tt.want)
		}
	}
}

func TestWriteAndHashImage(t *testing.T) {
	t.Parallel()
	boom := errors.New("client went away")
	data := func(n int64) []byte {
		b := make([]byte, n)
		rand.NewChaCha8([32]byte{byte(n)}).Read(b)
		return b
	}
	tests := []struct {
		name    string
		size    int64
		body    func(b []byte) io.Reader
		wantErr string
	}{
		{"empty", 0, func(b []byte) io.Reader { return bytes.NewReader(b) }, ""},
		{"one byte", 1, func(b []byte) io.Reader { return bytes.NewReader(b) }, ""},
		{"one block", blockSize, func(b []byte) io.Reader { return bytes.NewReader(b) }, ""},
		{"blocks and a bit, slow reads", 2*blockSize + 7, func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) }, ""},
		{"body short", blockSize + 5, func(b []byte) io.Reader { return bytes.NewReader(b[:blockSize]) }, "announced"},
		{"body long", blockSize, func(b []byte) io.Reader { return io.MultiReader(bytes.NewReader(b), strings.NewReader("x")) }, "more bytes than announced"},
		{"body fails", 3 * blockSize, func(b []byte) io.Reader {
			return io.MultiReader(bytes.NewReader(b[:blockSize+3]), iotest.ErrReader(boom))
		}, "client went away"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "img")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, imageSize(tt.size)); err != nil {
				t.Fatal(err)
			}
			b := data(tt.size)
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var counted []int64
			sum, err := writeImage(f, tt.body(b), tt.size, func(n int64) error { counted = append(counted, n); return nil })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || sum != "" {
					t.Fatalf("got %q, %v; want an error with %q", sum, err, tt.wantErr)
				}
				return
			}
			want := sha256.Sum256(b)
			if err != nil || sum != hex.EncodeToString(want[:]) {
				t.Fatalf("got %q, %v", sum, err)
			}
			if int64(len(counted)) != tt.size/blockSize || (len(counted) > 0 && counted[len(counted)-1] != tt.size/blockSize) {
				t.Fatalf("complete blocks reported %v for %d bytes", counted, tt.size)
			}
			if got, err := hashImage(f, tt.size); err != nil || got != sum {
				t.Fatalf("hashImage: %q, %v; want %q", got, err, sum)
			}
			if _, err := hashImage(f, imageSize(tt.size)+1); err == nil {
				t.Fatal("hashImage past the image's end: no error")
			}
		})
	}
}
