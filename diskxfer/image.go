package diskxfer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// Node-side image I/O. The image is written and read in blockSize buffers
// and hashed by a second goroutine, so sha256 (about 2 GB/s with the
// CPU's SHA extensions) overlaps the body's reading and the image's
// writing instead of adding to them. The image is not fsynced: it is a
// scratch copy whose only reader is the VM's disk, which Proxmox opens
// with O_DIRECT (cache.direct, FIDELITY.md), and the kernel writes dirty
// pages of a range back before a direct read of it; if the bytes the
// guest reads ever differed, its sha256 check would refuse them.

// hasher hashes blocks in its own goroutine. feed hands a block over and
// returns once the block before it is hashed, so a caller alternating two
// buffers may refill the other one; sum waits for the last block. The
// goroutine ends in sum, which every user calls (also on failure paths).
type hasher struct {
	h    hash.Hash
	in   chan []byte
	done chan struct{}
}

func newHasher() *hasher {
	hs := &hasher{h: sha256.New(), in: make(chan []byte), done: make(chan struct{})}
	go func() {
		defer close(hs.done)
		for b := range hs.in {
			hs.h.Write(b)
		}
	}()
	return hs
}

func (hs *hasher) feed(b []byte) { hs.in <- b }

// sum stops the goroutine and returns the digest in hex.
func (hs *hasher) sum() string {
	close(hs.in)
	<-hs.done
	return hex.EncodeToString(hs.h.Sum(nil))
}

// errLong: the body has more bytes than announced.
var errLong = errors.New("more bytes than announced")

// writeImage writes exactly size bytes of r to the start of f and returns
// their sha256. After each complete block it calls block with the number
// of complete blocks written so far; an error from it ends the write.
func writeImage(f *os.File, r io.Reader, size int64, block func(int64) error) (sum string, err error) {
	hs := newHasher()
	defer func() {
		if s := hs.sum(); err == nil {
			sum = s
		}
	}()
	bufs := [2][]byte{make([]byte, blockSize), make([]byte, blockSize)}
	var n int64
	for i := 0; ; i++ {
		b := bufs[i%2][:min(blockSize, size-n+1)]
		k, rerr := io.ReadFull(r, b)
		b = b[:k]
		n += int64(k)
		if n > size {
			return "", fmt.Errorf("body: %w (%d)", errLong, size)
		}
		if k > 0 {
			hs.feed(b)
			if _, err := f.WriteAt(b, n-int64(k)); err != nil {
				return "", fmt.Errorf("write image: %w", err)
			}
			if k == blockSize {
				if err := block(n / blockSize); err != nil {
					return "", err
				}
			}
		}
		switch {
		case errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF):
			if n != size {
				return "", fmt.Errorf("body has %d bytes, announced %d", n, size)
			}
			return "", nil
		case rerr != nil:
			return "", fmt.Errorf("read body: %w", rerr)
		}
	}
}

// hashImage returns the sha256 of the first size bytes of f.
func hashImage(f *os.File, size int64) (string, error) {
	hs := newHasher()
	bufs := [2][]byte{make([]byte, blockSize), make([]byte, blockSize)}
	var n int64
	for i := 0; n < size; i++ {
		b := bufs[i%2][:min(blockSize, size-n)]
		k, err := f.ReadAt(b, n)
		if k < len(b) {
			hs.sum()
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return "", fmt.Errorf("read image: %w", err)
		}
		hs.feed(b)
		n += int64(k)
	}
	return hs.sum(), nil
}
