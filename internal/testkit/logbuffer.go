package testkit

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// LogBuffer is a log sink that goroutines under test write to while the
// test reads it (a slog handler's writer).
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FailureLog returns a logger (text, every level from Info) whose records
// tb shows with t.Log only when it ended failed, once the cleanups
// registered after this call have run: a test bed made with it and closed
// in a later cleanup shows how each of its guests ended. Records are kept,
// never written to tb while the test runs, so goroutines may log after the
// test returned.
func FailureLog(tb testing.TB) *slog.Logger {
	buf := &LogBuffer{}
	tb.Cleanup(func() {
		if s := buf.String(); tb.Failed() && s != "" {
			tb.Logf("log of the failed test:\n%s", s)
		}
	})
	return slog.New(slog.NewTextHandler(buf, nil))
}
