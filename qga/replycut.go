package qga

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"time"
)

// A guest-exec-status reply is read through a cutter: the line is not
// buffered whole (on the direct path the agent sends what it captured, up
// to agentOutputCap per stream, whatever the request's output limit) but
// streamed through the connection's read buffer, and every JSON string in
// it is kept only up to the characters that hold limit+1 bytes of base64,
// so a reply costs what the request asked for, not what the agent sent.
// The cut prefix of an out-data or err-data value is still valid base64
// (a multiple of four characters, before any padding) of more than limit
// bytes, so collect reports the stream truncated exactly as if the whole
// value had been decoded. Keys and the other members are far shorter than
// the cut (it is never below minCut). The bytes kept are bounded too: two
// per kept character (QEMU's JSON writer escapes '/' as "\/",
// qobject/qjson.c) plus the envelope; a reply past that is too large, and
// the raw line, which costs time but no memory, is bounded by
// directReplyBound.

// minCut is the fewest characters a string is kept to: more than any key
// or non-data value of a status reply.
const minCut = 64

// statusCut is the characters kept of each string of a status reply whose
// streams are cut at limit bytes.
func statusCut(limit int64) int {
	return max(base64.StdEncoding.EncodedLen(int(limit)+1), minCut)
}

// cutter keeps a JSON text with every string cut to at most max
// characters (an escape sequence is one character). It is fed the line in
// pieces; state carries over.
type cutter struct {
	max      int
	inStr    bool
	esc      int  // -1: just after a backslash; n > 0: hex digits of \u still to come
	kept     int  // characters of the current string kept so far
	dropping bool // the current character (or escape sequence) is dropped
}

// feed appends to out what it keeps of b and returns it.
func (c *cutter) feed(out, b []byte) []byte {
	for len(b) > 0 {
		if c.inStr && c.esc == 0 && c.kept >= c.max {
			// Dropping the rest of a long string: skip to its next quote
			// or backslash at memchr speed.
			j := len(b)
			if q := bytes.IndexByte(b, '"'); q >= 0 {
				j = q
			}
			if e := bytes.IndexByte(b[:j], '\\'); e >= 0 {
				j = e
			}
			if b = b[j:]; len(b) == 0 {
				break
			}
		}
		out = c.byte(out, b[0])
		b = b[1:]
	}
	return out
}

// byte feeds one byte.
func (c *cutter) byte(out []byte, ch byte) []byte {
	switch {
	case !c.inStr:
		c.inStr = ch == '"'
		c.kept = 0
		return append(out, ch)
	case c.esc == -1:
		c.esc = 0
		if ch == 'u' {
			c.esc = 4
		}
	case c.esc > 0:
		c.esc--
	case ch == '"':
		c.inStr = false
		return append(out, ch)
	default: // a new character, plain or the backslash of an escape
		if ch == '\\' {
			c.esc = -1
		}
		c.dropping = c.kept >= c.max
		if !c.dropping {
			c.kept++
		}
	}
	if !c.dropping {
		out = append(out, ch)
	}
	return out
}

// readLineCut reads the next reply line through a cutter of cut
// characters: it keeps at most keep bytes (from the budget) and reads at
// most raw bytes of the line. release gives the kept bytes back; the line
// is valid until then.
func (cn *conn) readLineCut(cmd string, callEnd time.Time, cut, keep, raw int) (line []byte, release func(), err error) {
	c := cutter{max: cut}
	var out []byte
	taken := 0
	release = func() { cn.shrink(int64(taken)); taken = 0 }
	seen := 0
	for {
		chunk := cn.buf[cn.r:cn.w]
		end := bytes.IndexByte(chunk, '\n')
		if end < 0 {
			end = len(chunk)
		}
		seen += end
		if seen > raw {
			release()
			return nil, nil, cn.fail(KindTooLarge, cmd, fmt.Errorf("reply line longer than %d bytes", raw))
		}
		for data := chunk[:end]; len(data) > 0; {
			if cap(out) == len(out) {
				if cap(out) >= keep {
					release()
					return nil, nil, cn.fail(KindTooLarge, cmd, fmt.Errorf("reply keeps more than %d bytes of strings cut at %d characters", keep, cut))
				}
				grown := min(max(2*cap(out), 4<<10), keep)
				if err := cn.grow(int64(grown - taken)); err != nil {
					release()
					return nil, nil, cn.failBudget(cmd, err)
				}
				taken = grown
				nb := make([]byte, len(out), grown)
				copy(nb, out)
				out = nb
			}
			k := min(cap(out)-len(out), len(data))
			out = c.feed(out, data[:k]) // keeps at most k bytes: no reallocation
			data = data[k:]
		}
		if end < len(chunk) {
			cn.r += end + 1
			return out, release, nil
		}
		cn.r = cn.w
		if err := cn.fill(cmd, callEnd); err != nil {
			release()
			return nil, nil, err
		}
	}
}

// errDataWhileRunning: qemu-ga sends out-data and err-data only once the
// process ended (qmp_guest_exec_status in qga/commands.c fills them under
// `if (gei->finished)`); data on a not-exited status is a protocol error.
var errDataWhileRunning = errors.New("output data on a status of a command that has not exited")
