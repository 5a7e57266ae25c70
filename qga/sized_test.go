package qga

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// seekAgent answers open, seek (end with endReply, set with setReply), one
// read of "hello" with EOF, and close.
func seekAgent(t *testing.T, endReply, setReply string) *fakeAgent {
	f := newFakeAgent(t)
	f.setHandler(func(c net.Conn, cmd string, id, args json.RawMessage) bool {
		switch cmd {
		case "guest-file-open":
			reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
		case "guest-file-seek":
			var a struct{ Whence string }
			json.Unmarshal(args, &a)
			r := setReply
			if a.Whence == "end" {
				r = endReply
			}
			reply(c, `{"return": `+r+`, "id": `+string(id)+"}\n")
		case "guest-file-read":
			reply(c, `{"return": {"count": 5, "buf-b64": "aGVsbG8=", "eof": true}, "id": `+string(id)+"}\n")
		default:
			return okHandler(c, cmd, id, nil)
		}
		return true
	})
	return f
}

func TestReadFileSized(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		end, set      string
		wantSize      int64
		wantMalformed bool
	}{
		{"well formed", `{"position": 5, "eof": false}`, `{"position": 0, "eof": false}`, 5, false},
		{"negative size", `{"position": -1, "eof": false}`, `{"position": 0, "eof": false}`, 0, true},
		{"no position", `{"eof": false}`, `{"position": 0, "eof": false}`, 0, true},
		{"position not a number", `{"position": "5"}`, `{"position": 0}`, 0, true},
		{"rewind lands elsewhere", `{"position": 5}`, `{"position": 3}`, 0, true},
		{"not an object", `[]`, `{"position": 0}`, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := seekAgent(t, tt.end, tt.set)
			a := New(hostileOptions()).Agent(f.Socket)
			var got strings.Builder
			size := int64(-1)
			n, err := a.ReadFileSized(context.Background(), "/f", &got, 0, func(s int64) error {
				if got.Len() != 0 {
					t.Error("bytes reached the writer before the size callback")
				}
				size = s
				return nil
			})
			if tt.wantMalformed {
				var pe *ProtocolError
				if !errors.As(err, &pe) || pe.Kind != KindMalformed {
					t.Fatalf("got %v, want a malformed-reply protocol error", err)
				}
				if got.Len() != 0 || size != -1 {
					t.Fatalf("a rejected size reached the caller (size %d, %d bytes)", size, got.Len())
				}
				return
			}
			if err != nil || n != 5 || got.String() != "hello" || size != tt.wantSize {
				t.Fatalf("got n=%d size=%d %q err=%v", n, size, got.String(), err)
			}
		})
	}
}

func TestReadFileSizedRefused(t *testing.T) {
	t.Parallel()
	f := seekAgent(t, `{"position": 5}`, `{"position": 0}`)
	a := New(hostileOptions()).Agent(f.Socket)
	var got strings.Builder
	stop := errors.New("too big")
	_, err := a.ReadFileSized(context.Background(), "/f", &got, 0, func(int64) error { return stop })
	if !errors.Is(err, stop) || got.Len() != 0 {
		t.Fatalf("got %v and %d bytes, want the callback's error and nothing written", err, got.Len())
	}
	if _, err := a.ReadFileSized(context.Background(), "/f", &got, 0, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil callback: got %v, want ErrInvalid", err)
	}
}

// TestReadFileSizedRealAgent checks the seek-based size against qemu-ga.
func TestReadFileSizedRealAgent(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	ctx := testCtx(t, time.Minute)
	for _, content := range []string{"", "hello", strings.Repeat("x", 3<<20+7)} {
		p := g.Dir + "/sized"
		if err := a.WriteFile(ctx, p, strings.NewReader(content), 0o644); err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		size := int64(-1)
		n, err := a.ReadFileSized(ctx, p, &got, 0, func(s int64) error { size = s; return nil })
		if err != nil || n != int64(len(content)) || size != int64(len(content)) || got.String() != content {
			t.Fatalf("len %d: got n=%d size=%d err=%v", len(content), n, size, err)
		}
	}
}

func TestHostileCollectedExec(t *testing.T) {
	t.Parallel()
	// What is kept of a status reply is bounded by the limit
	// (TestStatusReplyBounded); the raw line, on either path, by what the
	// agent may capture of both streams.
	wrapped := map[string]string{"X": "y"}
	tests := []struct {
		name   string
		env    map[string]string
		status string
		kind   Kind
	}{
		{"bad base64", wrapped, `{"exited": true, "exitcode": 0, "out-data": "!!!!"}`, KindMalformed},
		{"exited without code", wrapped, `{"exited": true}`, KindMalformed},
		{"output over the bound", wrapped, `{"exited": true, "exitcode": 0, "out-data": "` + strings.Repeat("QUFB", (directReplyBound+2*readSize)/4) + `"}`, KindTooLarge},
		{"direct: output over the bound", nil, `{"exited": true, "exitcode": 0, "out-data": "` + strings.Repeat("QUFB", (directReplyBound+2*readSize)/4) + `"}`, KindTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newExecAgent(t, tt.status)
			opts := hostileOptions()
			opts.MaxReplyBytes = 64 << 10
			_, err := New(opts).Agent(f.Socket).Exec(context.Background(), ExecRequest{Argv: []string{"true"}, Env: tt.env, OutputLimit: 1000})
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Kind != tt.kind {
				t.Fatalf("got %v, want a %v protocol error", err, tt.kind)
			}
		})
	}
}

func TestCollectCutsAtLimit(t *testing.T) {
	st := &guestExec{OutData: "aGVsbG8=", ErrData: "", ErrTrunc: true}
	var res ExecResult
	if err := collect(&res, st, 3); err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "hel" || !res.StdoutTruncated || res.StdoutBytes != 3 || !res.StderrTruncated || len(res.Stderr) != 0 {
		t.Fatalf("got %+v", res)
	}
}

// TestReadFileSizedDirectory: a directory opens, its seek fails with EINVAL
// (what qemu-ga answers for a directory), and the read of a byte says "Is a
// directory": the sized read reports ErrIsDir (the API's is-a-directory),
// not the seek's generic error. A file whose seek fails but whose read works
// keeps the seek's error.
func TestReadFileSizedDirectory(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		readErr   bool
		wantIsDir bool
	}{{"directory", true, true}, {"unseekable file", false, false}} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAgent(t)
			f.setHandler(func(c net.Conn, cmd string, id, args json.RawMessage) bool {
				switch cmd {
				case "guest-file-open":
					reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
				case "guest-file-seek":
					reply(c, `{"error": {"class": "GenericError", "desc": "failed to seek file: Invalid argument"}, "id": `+string(id)+"}\n")
				case "guest-file-read":
					if tt.readErr {
						reply(c, `{"error": {"class": "GenericError", "desc": "failed to read file: Is a directory"}, "id": `+string(id)+"}\n")
					} else {
						reply(c, `{"return": {"count": 1, "buf-b64": "aA==", "eof": false}, "id": `+string(id)+"}\n")
					}
				default:
					return okHandler(c, cmd, id, nil)
				}
				return true
			})
			a := New(hostileOptions()).Agent(f.Socket)
			var got strings.Builder
			_, err := a.ReadFileSized(context.Background(), "/etc", &got, 0, func(int64) error {
				t.Error("size callback called for an unseekable handle")
				return nil
			})
			if err == nil || errors.Is(err, ErrIsDir) != tt.wantIsDir {
				t.Fatalf("got %v, want ErrIsDir %v", err, tt.wantIsDir)
			}
			if !tt.wantIsDir && !strings.Contains(err.Error(), "seek") {
				t.Fatalf("got %v, want the seek's error", err)
			}
			if got.Len() != 0 {
				t.Fatalf("%d bytes reached the writer", got.Len())
			}
		})
	}
}
