package pveapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// flakyTaskNode answers a download-url POST with a task whose status
// reads fail with 503 (as pveproxy does while it restarts) the first
// failures times (forever when negative), then say the task runs for two
// reads and ends OK.
type flakyTaskNode struct {
	failures int
	code     int // the failed reads' status (503 when 0)
	// slow is how long each failed read takes to answer (a pveproxy
	// that times out its own request to a hung pvedaemon)
	slow  time.Duration
	mu    sync.Mutex
	reads int
}

const flakyUPID = "UPID:pve1:00001234:00005678:6560A000:download:d.qcow2:builder@pve!t:"

func (f *flakyTaskNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodPost:
		fmt.Fprintf(w, `{"data":%q}`, flakyUPID)
	case strings.HasSuffix(r.URL.Path, "/status"):
		f.reads++
		switch {
		case f.failures < 0 || f.reads <= f.failures:
			code := f.code
			if code == 0 {
				code = http.StatusServiceUnavailable
			}
			time.Sleep(f.slow)
			http.Error(w, http.StatusText(code), code)
		case f.reads <= f.failures+2:
			fmt.Fprintf(w, `{"data":{"upid":%q,"node":"pve1","status":"running","type":"download","user":"builder@pve","tokenid":"t"}}`, flakyUPID)
		default:
			fmt.Fprintf(w, `{"data":{"upid":%q,"node":"pve1","status":"stopped","exitstatus":"OK","type":"download","user":"builder@pve","tokenid":"t"}}`, flakyUPID)
		}
	default:
		http.Error(w, "not in this test", http.StatusNotImplemented)
	}
}

// TestWaitOutlastsFailedStatusReads: a task whose status cannot be read
// for a while (pveproxy restarting, a 503) is still waited for: the call
// succeeds when the reads come back and the task ends OK, so its caller,
// told no *TaskUnfinishedError, stops nothing (templatebuild's
// stopDownload stopped a healthy download on the first failed read). Reads that fail for
// TaskStatusGrace in a row fail the wait with a *TaskUnfinishedError
// saying so.
func TestWaitOutlastsFailedStatusReads(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		code     int
		grace    time.Duration
		wantErr  string
		// wantReads is the status reads a failed wait made (0: at least 2)
		wantReads int
	}{
		{name: "a few failed reads", failures: 5, grace: time.Minute},
		{name: "reads that never come back", failures: -1, grace: 50 * time.Millisecond, wantErr: "could not be read for"},
		// a refusal is for good: no grace
		{name: "a read the token may not make", failures: -1, code: http.StatusForbidden, grace: time.Hour, wantErr: "cannot be read", wantReads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flakyTaskNode{failures: tc.failures, code: tc.code}
			srv := httptest.NewServer(f)
			t.Cleanup(srv.Close)
			c, err := New(Options{URL: srv.URL + "/api2/json", TokenID: "builder@pve!t", Secret: "s", Node: "pve1", HTTPClient: srv.Client(),
				TaskPoll: time.Millisecond, TaskStatusGrace: tc.grace})
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.DownloadURL(context.Background(), "local", Download{URL: "https://h/d.qcow2", Content: "import", Filename: "d.qcow2"})
			f.mu.Lock()
			defer f.mu.Unlock()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("download after %d failed status reads: %v", tc.failures, err)
				}
				if f.reads != tc.failures+3 {
					t.Errorf("%d status reads, want %d (the failed ones, two running, the end)", f.reads, tc.failures+3)
				}
			} else {
				var tu *TaskUnfinishedError
				code := cmp.Or(tc.code, http.StatusServiceUnavailable)
				if !errors.As(err, &tu) || tu.UPID != flakyUPID || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), strconv.Itoa(code)) {
					t.Fatalf("status never readable: %v, want a *TaskUnfinishedError of %s saying %q (and the %d)", err, flakyUPID, tc.wantErr, code)
				}
				switch {
				case tc.wantReads > 0 && f.reads != tc.wantReads:
					t.Errorf("gave up after %d status reads, want %d", f.reads, tc.wantReads)
				case tc.wantReads == 0 && f.reads < 2:
					t.Errorf("gave up after %d status reads", f.reads)
				}
			}
		})
	}
}

// TestWaitGraceCountsTheFailedReadsTime: TaskStatusGrace is the time the
// status reads have failed in a row, counted from the start of the first
// failed read, not from its answer: reads that each take a while to fail
// (100ms here, a grace of 150ms) end the wait at the second failed read,
// whose answer comes more than the grace after the first read began. The
// wait counted from the first failed answer, so it made a third read
// (with pveproxy's own timeouts, a "30 s" grace became more than a
// minute).
func TestWaitGraceCountsTheFailedReadsTime(t *testing.T) {
	f := &flakyTaskNode{failures: -1, slow: 100 * time.Millisecond}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := New(Options{URL: srv.URL + "/api2/json", TokenID: "builder@pve!t", Secret: "s", Node: "pve1", HTTPClient: srv.Client(),
		TaskPoll: time.Millisecond, TaskStatusGrace: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.DownloadURL(context.Background(), "local", Download{URL: "https://h/d.qcow2", Content: "import", Filename: "d.qcow2"})
	var tu *TaskUnfinishedError
	if !errors.As(err, &tu) || !strings.Contains(err.Error(), "could not be read for") {
		t.Fatalf("status never readable: %v, want a *TaskUnfinishedError saying it could not be read", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reads > 2 {
		t.Errorf("gave up after %d failed status reads of 100ms each, want at most 2 for a grace of 150ms", f.reads)
	}
}
