// Package qga measures the guest agent client (package qga) against
// two baselines on the same agent, side by side in one run:
//
//   - raw ceiling: the same bytes moved by a minimal loop of guest-file-write
//     (or guest-file-read) calls with the largest chunk qemu-ga accepts, on
//     one connection, without any checks;
//   - reference shape: how the Proxmox API path moves a file: one
//     open/write/close per 61,440-character base64 chunk, each command on
//     its own connection with a guest-sync-delimited first; reads in
//     1 MiB guest-file-read calls, capped at 16 MiB like the API.
//
// For exec it compares the round trip of `true` through Exec with RawExec
// at 1 ms: a bare guest-exec of /bin/true plus guest-exec-status every
// millisecond on one connection (raw; the API section of the bench uses the
// same loop as its baseline), medians of alternating rounds (execTrue), and
// with status polled once a second (reference shape).
//
// The bench command's qga section ([Section]) runs it against a test-bed
// guest; it talks to a real agent and writes files in the guest's /tmp.
package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/qga"
)

// DefaultSizes are the file sizes of the bench section.
var DefaultSizes = []int64{1 << 20, 64 << 20, 512 << 20}

const (
	// RawChunk is the largest guest-file-write chunk qemu-ga accepts
	// (measured on 7.2): its JSON parser refuses a message whose tokens
	// add up to more than 64 MiB, and the base64 string is nearly all of it.
	// 48 MiB - 48 is refused, 48 MiB - 192 accepted.
	RawChunk = 48<<20 - 192
	// RawReadChunk is the largest count guest-file-read accepts (48 MiB).
	RawReadChunk = 48 << 20
	// RefChunkChars is the Proxmox API's cap on one file-write's content.
	RefChunkChars = 61440
	// RefReadCap is where the Proxmox API's file-read stops.
	RefReadCap   = 16 << 20
	refReadChunk = 1 << 20
)

// Run benchmarks write and read of each size and an exec round trip
// against the agent at socket and prints MB/s and ratios to w.
func Run(ctx context.Context, w io.Writer, socket string, sizes []int64) error {
	if len(sizes) == 0 {
		sizes = DefaultSizes
	}
	c := qga.New(qga.Options{})
	a := c.Agent(socket)
	if err := a.Ping(ctx); err != nil {
		return fmt.Errorf("bench: agent: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tsize\tours MB/s\traw MB/s\tref MB/s\tours/raw\tours/ref\t")
	path := "/tmp/.qgabench-" + strconv.FormatUint(rand.Uint64(), 16)
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		a.Exec(ctx, qga.ExecRequest{Argv: []string{"rm", "-f", "--", path, path + ".raw", path + ".ref"}})
	}()
	for _, size := range sizes {
		seed := [32]byte{byte(size)}
		src := func() io.Reader { return io.LimitReader(rand.NewChaCha8(seed), size) }

		ours, err := timed(func() error { return a.WriteFile(ctx, path, src(), 0o644) })
		if err != nil {
			return fmt.Errorf("bench: ours write %d: %w", size, err)
		}
		raw, err := timed(func() error { return RawWrite(ctx, socket, path+".raw", src()) })
		if err != nil {
			return fmt.Errorf("bench: raw write %d: %w", size, err)
		}
		ref, err := timed(func() error { return RefWrite(ctx, socket, path+".ref", src()) })
		if err != nil {
			return fmt.Errorf("bench: reference write %d: %w", size, err)
		}
		row(tw, "write", size, ours, raw, ref)

		ours, err = timed(func() error {
			n, err := a.ReadFile(ctx, path, io.Discard, 0)
			return sizeErr(n, size, err)
		})
		if err != nil {
			return fmt.Errorf("bench: ours read %d: %w", size, err)
		}
		raw, err = timed(func() error {
			n, err := RawRead(ctx, socket, path+".raw", io.Discard)
			return sizeErr(n, size, err)
		})
		if err != nil {
			return fmt.Errorf("bench: raw read %d: %w", size, err)
		}
		ref = 0
		if size <= RefReadCap {
			ref, err = timed(func() error {
				n, err := RefRead(ctx, socket, path+".ref", io.Discard)
				return sizeErr(n, size, err)
			})
			if err != nil {
				return fmt.Errorf("bench: reference read %d: %w", size, err)
			}
		}
		row(tw, "read", size, ours, raw, ref)
	}
	ours, raw, err := execTrue(ctx, a, execRounds)
	if err != nil {
		return err
	}
	var ref time.Duration
	for range 3 {
		d, err := timed(func() error { return RawExec(ctx, socket, time.Second) })
		if err != nil {
			return fmt.Errorf("bench: reference exec: %w", err)
		}
		ref += d
	}
	ref /= 3
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	fmt.Fprintf(tw, "exec true\t\t%.2f ms\t%.2f ms\t%.1f ms\t%.2f\t%.2f\t\n", ms(ours), ms(raw), ms(ref), ms(raw)/ms(ours), ms(ref)/ms(ours))
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "ratios: throughput ours/baseline; for exec, baseline time/ours (above 1 = ours faster)\n"+
		"exec true, p50 of %d alternating rounds: ours %.2f ms, raw loop %.2f ms: ours/raw %.2fx (issue 18 goal: at most 1.30x)\n",
		execRounds, ms(ours), ms(raw), float64(ours)/float64(raw))
	return err
}

// execRounds is how many exec round trips each side of execTrue runs.
const execRounds = 40

// execTrue runs `true` through a.Exec and through RawExec (1 ms polls)
// rounds times each, alternating which goes first, and returns the two
// medians.
func execTrue(ctx context.Context, a *qga.Agent, rounds int) (ours, raw time.Duration, err error) {
	var o, r []time.Duration
	runOurs := func() error {
		d, err := timed(func() error {
			res, err := a.Exec(ctx, qga.ExecRequest{Argv: []string{"true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("true exited %d", res.ExitCode)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("bench: ours exec: %w", err)
		}
		o = append(o, d)
		return nil
	}
	runRaw := func() error {
		d, err := timed(func() error { return RawExec(ctx, a.Socket(), time.Millisecond) })
		if err != nil {
			return fmt.Errorf("bench: raw exec: %w", err)
		}
		r = append(r, d)
		return nil
	}
	for i := range rounds {
		first, second := runOurs, runRaw
		if i%2 == 1 {
			first, second = runRaw, runOurs
		}
		if err := first(); err != nil {
			return 0, 0, err
		}
		if err := second(); err != nil {
			return 0, 0, err
		}
	}
	return bench.Median(o), bench.Median(r), nil
}

func sizeErr(n, want int64, err error) error {
	if err == nil && n != want {
		err = fmt.Errorf("read %d bytes, want %d", n, want)
	}
	return err
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func row(w io.Writer, op string, size int64, ours, raw, ref time.Duration) {
	mbs := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	refs, ratio := "n/a", "n/a"
	if ref > 0 {
		refs = fmt.Sprintf("%.1f", mbs(ref))
		ratio = fmt.Sprintf("%.2f", mbs(ours)/mbs(ref))
	}
	fmt.Fprintf(w, "%s\t%s\t%.1f\t%.1f\t%s\t%.2f\t%s\t\n", op, human(size), mbs(ours), mbs(raw), refs, mbs(ours)/mbs(raw), ratio)
}

func human(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
}

// rawConn is the minimal protocol client of the baselines: no bounds, no
// checks beyond what is needed to get the answer.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func rawDial(ctx context.Context, socket string) (*rawConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	rc := &rawConn{c: c, br: bufio.NewReaderSize(c, 1<<20)}
	id := 1 + rand.IntN(99999)
	fmt.Fprintf(c, "\xff{\"execute\":\"guest-sync-delimited\",\"arguments\":{\"id\":%d}}\n", id)
	want := fmt.Appendf(nil, `{"return": %d}`, id)
	for {
		if _, err := rc.br.ReadBytes(0xFF); err != nil {
			c.Close()
			return nil, err
		}
		line, err := rc.br.ReadBytes('\n')
		if err != nil {
			c.Close()
			return nil, err
		}
		if bytes.Equal(bytes.TrimSpace(line), want) {
			return rc, nil
		}
	}
}

func (rc *rawConn) cmd(req []byte, out any) error {
	if _, err := rc.c.Write(req); err != nil {
		return err
	}
	line, err := rc.br.ReadBytes('\n')
	if err != nil {
		return err
	}
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Desc string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return err
	}
	if r.Error != nil {
		return errors.New(r.Error.Desc)
	}
	if out != nil {
		return json.Unmarshal(r.Return, out)
	}
	return nil
}

// close half-closes and reads to EOF (bounded) before closing: closing a
// unix socket with unread data resets it, and a unix-listen qemu-ga exits
// on that.
func (rc *rawConn) close() {
	if uc, ok := rc.c.(*net.UnixConn); ok {
		uc.CloseWrite()
		uc.SetReadDeadline(time.Now().Add(2 * time.Second))
		io.Copy(io.Discard, io.LimitReader(uc, 256<<20))
	}
	rc.c.Close()
}

func openReq(path, mode string) []byte {
	b, _ := json.Marshal(map[string]any{"execute": "guest-file-open", "arguments": map[string]string{"path": path, "mode": mode}})
	return append(b, '\n')
}

func writeReq(h int64, data []byte) []byte {
	req := fmt.Appendf(nil, `{"execute":"guest-file-write","arguments":{"handle":%d,"buf-b64":"`, h)
	req = base64.StdEncoding.AppendEncode(req, data)
	return append(req, "\"}}\n"...)
}

func closeReq(h int64) []byte {
	return fmt.Appendf(nil, `{"execute":"guest-file-close","arguments":{"handle":%d}}`+"\n", h)
}

// RawWrite is the write ceiling: one connection, RawChunk-sized
// guest-file-write calls, no checks.
func RawWrite(ctx context.Context, socket, path string, r io.Reader) error {
	rc, err := rawDial(ctx, socket)
	if err != nil {
		return err
	}
	defer rc.close()
	var h int64
	if err := rc.cmd(openReq(path, "w"), &h); err != nil {
		return err
	}
	buf := make([]byte, RawChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := rc.cmd(writeReq(h, buf[:n]), nil); err != nil {
				return err
			}
		}
		if rerr != nil {
			break
		}
	}
	return rc.cmd(closeReq(h), nil)
}

// RawRead is the read ceiling: one connection, 48 MiB guest-file-read
// calls, no checks.
func RawRead(ctx context.Context, socket, path string, w io.Writer) (int64, error) {
	rc, err := rawDial(ctx, socket)
	if err != nil {
		return 0, err
	}
	defer rc.close()
	var h int64
	if err := rc.cmd(openReq(path, "r"), &h); err != nil {
		return 0, err
	}
	var total int64
	for {
		var ret struct {
			Data []byte `json:"buf-b64"`
			EOF  bool   `json:"eof"`
		}
		if err := rc.cmd(fmt.Appendf(nil, `{"execute":"guest-file-read","arguments":{"handle":%d,"count":%d}}`+"\n", h, RawReadChunk), &ret); err != nil {
			return total, err
		}
		n, _ := w.Write(ret.Data)
		total += int64(n)
		if ret.EOF {
			break
		}
	}
	return total, rc.cmd(closeReq(h), nil)
}

// refCmd runs one command on its own connection, like a Proxmox API call.
func refCmd(ctx context.Context, socket string, req []byte, out any) error {
	rc, err := rawDial(ctx, socket)
	if err != nil {
		return err
	}
	defer rc.close()
	return rc.cmd(req, out)
}

// RefWrite has the reference path's shape: per 61,440-character base64
// chunk an open (append), a write and a close, each on its own connection.
func RefWrite(ctx context.Context, socket, path string, r io.Reader) error {
	buf := make([]byte, RefChunkChars/4*3)
	mode := "w"
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || mode == "w" {
			var h int64
			if err := refCmd(ctx, socket, openReq(path, mode), &h); err != nil {
				return err
			}
			mode = "a"
			if err := refCmd(ctx, socket, writeReq(h, buf[:n]), nil); err != nil {
				return err
			}
			if err := refCmd(ctx, socket, closeReq(h), nil); err != nil {
				return err
			}
		}
		if rerr != nil {
			return nil
		}
	}
}

// RefRead has the reference path's shape: open, 1 MiB reads and close,
// each on its own connection; like the API it refuses files over 16 MiB.
func RefRead(ctx context.Context, socket, path string, w io.Writer) (int64, error) {
	var h int64
	if err := refCmd(ctx, socket, openReq(path, "r"), &h); err != nil {
		return 0, err
	}
	defer refCmd(context.WithoutCancel(ctx), socket, closeReq(h), nil)
	var total int64
	for total <= RefReadCap {
		var ret struct {
			Data []byte `json:"buf-b64"`
			EOF  bool   `json:"eof"`
		}
		if err := refCmd(ctx, socket, fmt.Appendf(nil, `{"execute":"guest-file-read","arguments":{"handle":%d,"count":%d}}`+"\n", h, refReadChunk), &ret); err != nil {
			return total, err
		}
		n, _ := w.Write(ret.Data)
		total += int64(n)
		if ret.EOF {
			return total, nil
		}
	}
	return total, fmt.Errorf("reference read stops at %d bytes", RefReadCap)
}

// RawExec runs /bin/true with a bare guest-exec and polls its status every
// interval on one connection.
func RawExec(ctx context.Context, socket string, interval time.Duration) error {
	rc, err := rawDial(ctx, socket)
	if err != nil {
		return err
	}
	defer rc.close()
	var ret struct {
		PID int `json:"pid"`
	}
	if err := rc.cmd([]byte(`{"execute":"guest-exec","arguments":{"path":"/bin/true","capture-output":true}}`+"\n"), &ret); err != nil {
		return err
	}
	for {
		var st struct {
			Exited bool `json:"exited"`
		}
		if err := rc.cmd(fmt.Appendf(nil, `{"execute":"guest-exec-status","arguments":{"pid":%d}}`+"\n", ret.PID), &st); err != nil {
			return err
		}
		if st.Exited {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
