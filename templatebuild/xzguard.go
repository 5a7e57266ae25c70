package templatebuild

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// maxXZDict bounds the LZMA2 dictionary of an archive's blocks: 64 MiB,
// what xz -9 (the largest preset) uses; a larger one would count against
// the daemon's memory budget (README, "The daemon's worst-case memory").
const maxXZDict = 64 << 20

// maxXZBlocks bounds the blocks of one xz stream: the decoder keeps a
// 16-byte index record of each block until the stream's end, and a block
// can be 12 bytes long; 2^18 blocks (4 MiB of records) is a 64 GiB disk
// in blocks of 256 KiB (xz -T0 makes blocks of 3 dictionaries, 24 MiB at
// its default level).
const maxXZBlocks = 1 << 18

// xzDictSlack is what the dictionaries of an archive's blocks may sum to
// beyond the bytes it unpacks to (xzGuard's dictLeft): 16 dictionaries of
// maxXZDict, 1 GiB. The decoder allocates (and the Go runtime zeroes) a
// new dictionary for every block, so a stream of 20-byte blocks each
// declaring 64 MiB had it allocate 64 GiB for a 22 KB archive (six
// seconds of a core here, hours for a download of a few MB); bounded by
// the archive's unpacked bound plus this slack, the dictionaries cost no
// more than writing what the archive may unpack to. An archive of xz's
// own making stays far below it: xz -T0 makes blocks of three
// dictionaries each, a single-threaded xz one block, and even xz
// --block-size=16KiB (8 MiB dictionaries, testdata/unpack/multi.tar.xz)
// allocates 1 GiB only past 128 blocks, i.e. 2 MiB unpacked.
const xzDictSlack = 16 * maxXZDict

// xzGuard passes an xz stream through unchanged and follows its framing
// without decompressing it (stream header, block headers, the LZMA2
// chunks' control bytes and sizes, block padding and check, index,
// footer, stream padding): the read that brings a block header whose
// LZMA2 dictionary is larger than maxDict, or a stream's block past
// maxBlocks, fails. The decoder
// (github.com/ulikunitz/xz) allocates the dictionary each block header
// declares, up to 4 GiB, and the archive's digest is known only once it
// has been read to its end: without the guard, a hostile archive would
// have the daemon allocate 4 GiB before anything could refuse it. It also
// refuses what that decoder does not take anyway (a filter chain other
// than LZMA2 alone), so that the chunk framing it follows is the one the
// decoder reads. The rest of the format's checks (CRCs, index, sizes) are
// the decoder's.
type xzGuard struct {
	r         io.Reader
	maxDict   int64
	maxBlocks int
	st        xzState
	// blocks counts the current stream's blocks.
	blocks int
	// dictLeft is what the dictionaries of the archive's blocks still to
	// come may sum to (every stream's: the decoder allocates each block's
	// dictionary anew).
	dictLeft int64
	// hdr collects a header's bytes until it has want of them.
	hdr  []byte
	want int
	// skip is how many bytes pass before the next state's.
	skip int64
	// check is the size of each block's check (the stream flags').
	check int64
	// compressed counts the current block's compressed bytes (its
	// padding aligns them to 4).
	compressed int64
	// varint is the index varint being read (varintLen bytes so far);
	// records the index records' varints still to read; indexLen the
	// index's bytes so far.
	varint, varintLen, records, indexLen int64
	err                                  error
}

type xzState int

const (
	xzStreamHeader xzState = iota
	xzBlockStart
	xzBlockHeader
	xzChunk
	xzChunkHeader
	xzIndexCount
	xzIndexRecords
	xzFooter
	xzStreamPadding
)

var (
	xzMagic       = []byte{0xFD, '7', 'z', 'X', 'Z', 0x00}
	errXZFraming  = errors.New("not an xz stream this build reads")
	xzCheckSizes  = [16]int64{0, 4, 4, 4, 8, 8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 64}
	lzma2FilterID = byte(0x21)
)

// newXZGuard guards r: a block's dictionary at most maxDict, a stream's
// blocks at most maxBlocks, the archive's dictionaries at most dictBudget
// together.
func newXZGuard(r io.Reader, maxDict int64, maxBlocks int, dictBudget int64) *xzGuard {
	return &xzGuard{r: r, maxDict: maxDict, maxBlocks: maxBlocks, dictLeft: dictBudget, st: xzStreamHeader, want: 12}
}

// Read implements io.Reader.
func (g *xzGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	if ferr := g.feed(p[:n]); ferr != nil {
		g.err = fmt.Errorf("xz: %w", ferr)
		return 0, g.err
	}
	return n, err
}

// feed follows the framing over b.
func (g *xzGuard) feed(b []byte) error {
	for len(b) > 0 {
		if g.skip > 0 {
			n := min(int64(len(b)), g.skip)
			g.skip -= n
			b = b[n:]
			continue
		}
		if g.want > 0 {
			n := min(len(b), g.want-len(g.hdr))
			g.hdr = append(g.hdr, b[:n]...)
			b = b[n:]
			if len(g.hdr) < g.want {
				continue
			}
			h := g.hdr
			g.hdr, g.want = g.hdr[:0], 0
			if err := g.header(h); err != nil {
				return err
			}
			continue
		}
		c := b[0]
		b = b[1:]
		if err := g.byte(c); err != nil {
			return err
		}
	}
	return nil
}

// collect has the next n bytes gathered and handed to header in state st.
func (g *xzGuard) collect(st xzState, n int) {
	g.st, g.want = st, n
}

// byte handles one byte of a state read byte by byte.
func (g *xzGuard) byte(c byte) error {
	switch g.st {
	case xzBlockStart:
		if c == 0 {
			g.st, g.indexLen, g.varint, g.varintLen = xzIndexCount, 1, 0, 0
			return nil
		}
		if g.blocks++; g.blocks > g.maxBlocks {
			return fmt.Errorf("a stream of more than %d blocks: refused (the decoder keeps a record of each)", g.maxBlocks)
		}
		g.hdr = append(g.hdr[:0], c)
		g.collect(xzBlockHeader, (int(c)+1)*4)
		return nil
	case xzChunk:
		g.compressed++
		switch {
		case c == 0x00: // the block's end: padding, then its check
			g.skip = (4-g.compressed%4)%4 + g.check
			g.st = xzBlockStart
		case c == 0x01 || c == 0x02: // an uncompressed chunk
			g.hdr = append(g.hdr[:0], c)
			g.collect(xzChunkHeader, 3)
		case c >= 0x80: // an LZMA chunk, with new properties from 0xC0
			g.hdr = append(g.hdr[:0], c)
			g.collect(xzChunkHeader, 5+int(c>>6&1))
		default:
			return fmt.Errorf("%w: LZMA2 control byte %#x", errXZFraming, c)
		}
		return nil
	case xzIndexCount, xzIndexRecords:
		return g.indexByte(c)
	case xzStreamPadding:
		switch c {
		case 0:
		case xzMagic[0]:
			g.hdr = append(g.hdr[:0], c)
			g.collect(xzStreamHeader, 12)
		default:
			return fmt.Errorf("%w: %#x after a stream", errXZFraming, c)
		}
		return nil
	}
	return fmt.Errorf("%w: state %d", errXZFraming, g.st)
}

// indexByte reads the index's varints (its record count, then two per
// record); then its padding and CRC32, and the stream footer.
func (g *xzGuard) indexByte(c byte) error {
	g.indexLen++
	if g.varintLen == 9 || (g.varintLen > 0 && c == 0) {
		return fmt.Errorf("%w: a malformed index", errXZFraming)
	}
	g.varint |= int64(c&0x7F) << (7 * g.varintLen)
	g.varintLen++
	if c&0x80 != 0 {
		return nil
	}
	v := g.varint
	g.varint, g.varintLen = 0, 0
	if g.st == xzIndexCount {
		if v < 0 || v > 1<<40 {
			return fmt.Errorf("%w: an index of %d records", errXZFraming, v)
		}
		g.st, g.records = xzIndexRecords, 2*v
	} else {
		g.records--
	}
	if g.records > 0 {
		return nil
	}
	// padding to 4, the CRC32, then the footer
	g.skip = (4-g.indexLen%4)%4 + 4
	g.collect(xzFooter, 12)
	return nil
}

// header handles a collected header h of the state it was collected for.
func (g *xzGuard) header(h []byte) error {
	switch g.st {
	case xzStreamHeader:
		if string(h[:6]) != string(xzMagic) || h[6] != 0 || h[7]&0xF0 != 0 {
			return fmt.Errorf("%w: no stream header", errXZFraming)
		}
		g.check = xzCheckSizes[h[7]&0x0F]
		g.st, g.blocks = xzBlockStart, 0
	case xzBlockHeader:
		if err := g.blockHeader(h); err != nil {
			return err
		}
		g.st, g.compressed = xzChunk, 0
	case xzChunkHeader:
		var size int64
		if h[0] <= 0x02 {
			size = int64(binary.BigEndian.Uint16(h[1:3])) + 1
		} else {
			size = int64(binary.BigEndian.Uint16(h[3:5])) + 1
		}
		g.compressed += int64(len(h)-1) + size
		g.skip = size
		g.st = xzChunk
	case xzFooter:
		if h[10] != 'Y' || h[11] != 'Z' {
			return fmt.Errorf("%w: no stream footer", errXZFraming)
		}
		g.st = xzStreamPadding
	default:
		return fmt.Errorf("%w: state %d", errXZFraming, g.st)
	}
	return nil
}

// blockHeader checks a block header h (its size byte first, its CRC32
// last, which the decoder checks): one filter, LZMA2, whose dictionary
// is at most maxDict.
func (g *xzGuard) blockHeader(h []byte) error {
	flags := h[1]
	if flags&0x3F != 0 {
		return fmt.Errorf("%w: a block of %d filters or reserved flags (%#x): only LZMA2 alone is read", errXZFraming, flags&3+1, flags)
	}
	pos := 2
	for _, present := range []bool{flags&0x40 != 0, flags&0x80 != 0} {
		if !present {
			continue
		}
		n, ok := uvarintLen(h[pos : len(h)-4])
		if !ok {
			return fmt.Errorf("%w: a malformed block header", errXZFraming)
		}
		pos += n
	}
	// the filter: id 0x21, one byte of properties, the dictionary size
	if len(h)-4-pos < 3 || h[pos] != lzma2FilterID || h[pos+1] != 1 {
		return fmt.Errorf("%w: a block whose filter is not LZMA2", errXZFraming)
	}
	dict, ok := lzma2Dict(h[pos+2])
	if !ok {
		return fmt.Errorf("%w: an LZMA2 dictionary size property %#x", errXZFraming, h[pos+2])
	}
	if dict > g.maxDict {
		return fmt.Errorf("a block's LZMA2 dictionary is %d MiB, more than the %d MiB this build decodes with (xz -9's)", dict>>20, g.maxDict>>20)
	}
	if dict > g.dictLeft {
		return fmt.Errorf("the blocks' LZMA2 dictionaries sum to more than the archive may unpack to and %d MiB (the decoder allocates each block's anew): refused", xzDictSlack>>20)
	}
	g.dictLeft -= dict
	return nil
}

// uvarintLen is the length of the xz varint at the start of b.
func uvarintLen(b []byte) (int, bool) {
	for i := 0; i < len(b) && i < 9; i++ {
		if b[i]&0x80 == 0 {
			return i + 1, i == 0 || b[i] != 0
		}
	}
	return 0, false
}

// lzma2Dict is the dictionary size an LZMA2 property byte says (the xz
// file format's 5.3.1: 2 or 3 times a power of two from 4 KiB, 40 for
// 4 GiB - 1).
func lzma2Dict(p byte) (int64, bool) {
	switch {
	case p > 40:
		return 0, false
	case p == 40:
		return 1<<32 - 1, true
	}
	return int64(2|p&1) << (p/2 + 11), true
}
