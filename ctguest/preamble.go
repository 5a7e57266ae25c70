package ctguest

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// preamble cuts what a script prints before its payload off the start of
// its stdout: the marker line and, for a read, the size line. It is the
// one parser of container output in this package: it keeps at most one
// bounded line, takes the marker byte for byte and a size only as 1 to 19
// decimal digits.
type preamble struct {
	sized bool // a size line follows the marker

	line  []byte // the line being read (at most maxPreambleLine bytes)
	state int    // preMarker, preSize, preDone
	size  int64
	// started: the marker line came whole.
	started bool
}

const (
	preMarker = iota
	preSize
	preDone
)

// maxPreambleLine bounds a preamble line, its newline included.
const maxPreambleLine = 32

var errPreamble = errors.New("malformed preamble")

// feed takes the next bytes of stdout and returns those that are
// payload. Once it returned an error, the stream is not the script's.
func (p *preamble) feed(b []byte) ([]byte, error) {
	for p.state != preDone && len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		take := b
		if i >= 0 {
			take = b[:i]
		}
		if len(p.line)+len(take) >= maxPreambleLine {
			return nil, fmt.Errorf("%w: a line of more than %d bytes", errPreamble, maxPreambleLine-1)
		}
		p.line = append(p.line, take...)
		if p.state == preMarker && !bytes.HasPrefix([]byte(marker), p.line) {
			return nil, fmt.Errorf("%w: %q is not the marker", errPreamble, p.line)
		}
		if i < 0 {
			return nil, nil
		}
		b = b[i+1:]
		if err := p.endLine(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// endLine takes the complete line.
func (p *preamble) endLine() error {
	line := p.line
	p.line = p.line[:0]
	switch p.state {
	case preMarker:
		if string(line) != marker {
			return fmt.Errorf("%w: %q is not the marker", errPreamble, line)
		}
		p.started = true
		p.state = preDone
		if p.sized {
			p.state = preSize
		}
	case preSize:
		n, err := parseSize(line)
		if err != nil {
			return err
		}
		p.size, p.state = n, preDone
	}
	return nil
}

// parseSize reads a file size: 1 to 19 decimal digits (no sign, no
// space).
func parseSize(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 19 {
		return 0, fmt.Errorf("%w: size %q", errPreamble, b)
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: size %q", errPreamble, b)
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: size %q", errPreamble, b)
	}
	return n, nil
}

// done reports whether the whole preamble came.
func (p *preamble) done() bool { return p.state == preDone }
