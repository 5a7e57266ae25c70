package pveapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDownloadCancelledDuringItsPost: a caller whose context ends while
// the download-url POST is in flight still learns the task's UPID (a
// *TaskUnfinishedError carries it), so that it can stop the task.
// Proxmox forks the download's worker whether or not anyone reads the
// answer (pve-storage API2/Storage/Status.pm download_url: fork_worker),
// and a POST cut short by the context left a task no one could stop: its
// wget went on downloading after the build had given up (review 51c).
// Then the call stops the task it learnt of, as StopTask does: the
// DELETE goes to the node the UPID names.
func TestDownloadCancelledDuringItsPost(t *testing.T) {
	const upid = "UPID:pve1:00001234:00005678:6560A000:download:d.qcow2:builder@pve:"
	posted, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var deletes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/storage/local/download-url"):
			// the worker is forked: the answer only tells its UPID
			close(posted)
			<-release
			fmt.Fprintf(w, `{"data":%q}`, upid)
		case r.Method == http.MethodDelete:
			mu.Lock()
			deletes = append(deletes, r.URL.Path)
			mu.Unlock()
			fmt.Fprint(w, `{"data":null}`)
		default:
			fmt.Fprintf(w, `{"data":{"upid":%q,"node":"pve1","status":"running","type":"download","user":"builder@pve"}}`, upid)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := New(Options{URL: srv.URL + "/api2/json", TokenID: "builder@pve!t", Secret: "s", Node: "pve1", HTTPClient: srv.Client(), TaskPoll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.DownloadURL(ctx, "local", Download{URL: "https://h/d.qcow2", Content: "import", Filename: "d.qcow2"})
		done <- err
	}()
	<-posted
	cancel()
	// the answer comes once the caller has given up
	time.Sleep(50 * time.Millisecond)
	close(release)
	err = <-done
	var tu *TaskUnfinishedError
	if !errors.As(err, &tu) || tu.UPID != upid || !errors.Is(err, context.Canceled) {
		t.Fatalf("a download cancelled during its POST: %v, want a *TaskUnfinishedError of %s (and the cancel)", err, upid)
	}
	if err := c.StopTask(ctx, tu.UPID); err != nil {
		t.Fatalf("stop with the caller's context done: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "/api2/json/nodes/pve1/tasks/" + upid; len(deletes) != 1 || deletes[0] != want {
		t.Errorf("stops %q, want DELETE %s", deletes, want)
	}
}
