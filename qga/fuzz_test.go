package qga

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzParseReply: whatever the agent sends as a reply line, the parser
// returns a value only for a strict reply to our id, and otherwise a typed
// error, and never panics.
func FuzzParseReply(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": 5}`), uint32(5))
	f.Add([]byte(`{"return": 17}`), uint32(17))
	f.Fuzz(func(t *testing.T, line []byte, id uint32) {
		var ret any
		err := parseReply(line, "guest-x", id, false, &ret)
		var pe *ProtocolError
		var ae *AgentError
		switch {
		case err == nil:
			if !json.Valid(line) {
				t.Fatalf("accepted %q", line)
			}
		case errors.As(err, &ae):
			if len(ae.Desc) > maxDescLen+3 || !utf8.ValidString(ae.Desc) || !utf8.ValidString(ae.Class) {
				t.Fatalf("unbounded or invalid desc %q", ae.Desc)
			}
		case errors.As(err, &pe):
		default:
			t.Fatalf("untyped error %T %v", err, err)
		}
		if got, err := parseSyncReply(line); err == nil && !json.Valid(line) {
			t.Fatalf("sync accepted %q as %d", line, got)
		}
	})
}

// FuzzSession feeds arbitrary agent output to a whole session (sync and
// one command): it ends in a result or an error, within its bounds.
func FuzzSession(f *testing.F) {
	f.Add([]byte("\xff{\"return\": 1}\n{\"return\": {\"version\": \"7.2\", \"supported_commands\": []}, \"id\": 2}\n"))
	f.Add([]byte("{\"error\": {\"class\": \"GenericError\", \"desc\": \"JSON parse error\"}}\n\xff{\"return\": 1}\n{\"error\": {\"class\": \"GenericError\", \"desc\": \"x\"}, \"id\": 2}\n"))
	f.Fuzz(func(t *testing.T, agent []byte) {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs := fileConn(t, fds[0]), fileConn(t, fds[1])
		defer theirs.Close()
		go func() {
			theirs.Write(agent)
			theirs.CloseWrite()
			buf := make([]byte, 4096)
			for {
				if _, err := theirs.Read(buf); err != nil {
					return
				}
			}
		}()
		c := New(Options{StallTimeout: time.Second, DrainTimeout: 100 * time.Millisecond, MaxChunk: minChunk, MaxReplyBytes: 4096})
		cn := &conn{c: c, socket: "fuzz", nc: ours, ctx: context.Background(), stop: func() bool { return true }}
		var in Info
		err = cn.sync()
		if err == nil {
			err = cn.call("guest-info", nil, &in)
		}
		cn.close()
		var pe *ProtocolError
		var ae *AgentError
		if err != nil && !errors.As(err, &pe) && !errors.As(err, &ae) {
			t.Fatalf("untyped error %T %v", err, err)
		}
		if pe != nil && pe.Kind == KindTimeout {
			t.Fatalf("timeout on a closed stream: %v", err)
		}
		if p := c.PeakBufferedBytes(); p > int64(c.Options().MaxReplyBytes+readSize) {
			t.Fatalf("buffered %d", p)
		}
		if c.BufferedBytes() != 0 {
			t.Fatalf("%d bytes left buffered", c.BufferedBytes())
		}
	})
}

// FuzzExecStatus: whatever a guest-exec-status reply holds, the collected
// result stays within the limit and errors are typed.
func FuzzExecStatus(f *testing.F) {
	f.Add([]byte(`{"return": {"exited": true, "exitcode": 0, "out-data": "aGVsbG8=", "out-truncated": true}, "id": 1}`), uint16(3))
	f.Add([]byte(`{"return": {"exited": true, "signal": 9, "err-data": "////"}, "id": 1}`), uint16(0))
	f.Fuzz(func(t *testing.T, line []byte, limit uint16) {
		var st guestExec
		if err := parseReply(line, "guest-exec-status", 1, false, &st); err != nil {
			return
		}
		var res ExecResult
		err := collect(&res, &st, int64(limit))
		var pe *ProtocolError
		if err != nil {
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %T %v", err, err)
			}
			return
		}
		st.outcome(&res)
		if int64(len(res.Stdout)) > int64(limit) || int64(len(res.Stderr)) > int64(limit) ||
			res.StdoutBytes != int64(len(res.Stdout)) || res.StderrBytes != int64(len(res.Stderr)) {
			t.Fatalf("result %+v beyond limit %d", res, limit)
		}
		if full, _ := base64.StdEncoding.DecodeString(st.OutData); len(full) > int(limit) && !res.StdoutTruncated ||
			!bytes.HasPrefix(full, res.Stdout) {
			t.Fatalf("stdout %q of %q not flagged or not a prefix", res.Stdout, full)
		}
	})
}

func fileConn(t *testing.T, fd int) *net.UnixConn {
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}
