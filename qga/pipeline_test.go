package qga

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadAhead(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name   string
		src    io.Reader
		asks   []int
		want   []string
		wantEr error // of the last chunk
	}{
		{"exact chunks", strings.NewReader("abcdef"), []int{3, 3, 3}, []string{"abc", "def", ""}, io.EOF},
		{"short last chunk", strings.NewReader("abcde"), []int{2, 4}, []string{"ab", "cde"}, io.EOF},
		{"sizes change between chunks", strings.NewReader("abcdefghij"), []int{1, 4, 8}, []string{"a", "bcde", "fghij"}, io.EOF},
		{"one byte per read", iotest.OneByteReader(strings.NewReader("abcdef")), []int{4, 4}, []string{"abcd", "ef"}, io.EOF},
		{"source fails", io.MultiReader(strings.NewReader("ab"), iotest.ErrReader(boom)), []int{2, 2}, []string{"ab", ""}, boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ra := newReadAhead(tt.src)
			defer ra.stop()
			ra.request(tt.asks[0])
			var prev []byte
			for i, want := range tt.want {
				c := ra.next()
				// The chunk before stays intact while this one is read.
				if i > 0 && string(prev) != tt.want[i-1] {
					t.Fatalf("chunk %d changed to %q while the next was read", i-1, prev)
				}
				if i+1 < len(tt.asks) && c.err == nil {
					ra.request(tt.asks[i+1])
				}
				if string(c.b) != want || c.asked != tt.asks[i] {
					t.Fatalf("chunk %d: %q (asked %d), want %q (asked %d)", i, c.b, c.asked, want, tt.asks[i])
				}
				if i == len(tt.want)-1 && !errors.Is(c.err, tt.wantEr) {
					t.Fatalf("last chunk error %v, want %v", c.err, tt.wantEr)
				}
				prev = c.b
			}
		})
	}
}

// TestReadAheadStopWaitsForRead: stop with a chunk in flight returns only
// after the read, so the source is not used after it.
func TestReadAheadStopWaitsForRead(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	ra := newReadAhead(pr)
	ra.request(4)
	stopped := make(chan struct{})
	go func() { ra.stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while a read was in progress")
	default:
	}
	pw.Write([]byte("abcd"))
	<-stopped
}

type failingWriter struct {
	n   int // bytes accepted before failing
	got bytes.Buffer
}

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.got.Len()+len(p) > f.n {
		k := f.n - f.got.Len()
		f.got.Write(p[:k])
		return k, errors.New("disk full")
	}
	return f.got.Write(p)
}

func TestAsyncWriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		accept  int
		chunks  []string
		wantN   int64
		wantErr bool
	}{
		{"all written", 100, []string{"ab", "cd", "", "e"}, 5, false},
		{"writer fails mid-chunk", 3, []string{"ab", "cd", "ef", "gh"}, 3, true},
		{"writer fails at once", 0, []string{"ab", "cd"}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fw := &failingWriter{n: tt.accept}
			aw := newAsyncWriter(fw)
			var werr error
			for _, c := range tt.chunks {
				if werr = aw.write([]byte(c)); werr != nil {
					break
				}
			}
			n, err := aw.close()
			if n != tt.wantN || (err != nil) != tt.wantErr || int64(fw.got.Len()) != n {
				t.Fatalf("n=%d err=%v (written %q), want n=%d err=%v", n, err, fw.got.String(), tt.wantN, tt.wantErr)
			}
			if werr != nil && !errors.Is(werr, err) {
				t.Fatalf("write returned %v, close %v", werr, err)
			}
		})
	}
}
