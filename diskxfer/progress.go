package diskxfer

import (
	"fmt"
	"os"
)

// The progress record lets the guest copy an upload while the node still
// writes it. It is the 4 KiB right after the image's data blocks (at
// imageSize(size)), one text line padded with zeros:
//
//	pvei <serial> <blocks> <blocks> <state> [<sha256>]
//
// <blocks> counts the leading 4 MiB blocks that are completely written;
// state is w (writing), d (done: every block written, the sha256 of the
// size bytes follows) or x (the node gave up). The node writes the data
// before the record that counts it, so a guest that sees a count reads
// written blocks (a direct read of a range sees the node's page cache,
// FIDELITY.md). A read racing the record's rewrite may see a mix of the
// old and the new line; the count is written twice and the guest takes
// it only when both agree, so a torn line reads as the old or the new
// count, or not at all.
const recordSize = 4096

// writeRecord writes the progress record of an image holding size bytes.
func writeRecord(f *os.File, size int64, serial string, blocks int64, state byte, sum string) error {
	var rec [recordSize]byte
	line := fmt.Sprintf("pvei %s %d %d %c %s\n", serial, blocks, blocks, state, sum)
	copy(rec[:], line)
	if _, err := f.WriteAt(rec[:], imageSize(size)); err != nil {
		return fmt.Errorf("write progress record: %w", err)
	}
	return nil
}
