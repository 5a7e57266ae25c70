package pveemu

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTaskOwner is Tasks.pm $check_task_user: a token's task is the
// token's and its user's, a user's task its user's alone.
func TestTaskOwner(t *testing.T) {
	for _, tc := range []struct {
		task, caller string
		want         bool
	}{
		{"dl@pve!tok", "dl@pve!tok", true},
		{"dl@pve!tok", "dl@pve", true},
		{"dl@pve!tok", "dl@pve!other", false},
		{"dl@pve", "dl@pve", true},
		{"dl@pve", "dl@pve!tok", false},
		{"dl@pve", "root@pam", false},
	} {
		if got := taskOwner(tc.task, tc.caller); got != tc.want {
			t.Errorf("task of %s, caller %s: owner %v, want %v", tc.task, tc.caller, got, tc.want)
		}
	}
}

// TestStopDownload: DELETE /nodes/{node}/tasks/{upid} (Tasks.pm
// stop_task) stops a running download-url task for its owner, whose
// worker dies "received interrupt" inside wget's run_command (exit
// status "download failed: received interrupt") and removes its
// temporary file: nothing is left on the storage. A token that is not
// the owner (another user's, or another token of the owner's user) is
// refused without Sys.Modify on the node; pve-access-setup's token has
// it there (its node role). A task that has ended is stopped without
// error.
func TestStopDownload(t *testing.T) {
	img := qcow2Image(1 << 20)
	ended, asked := make(chan struct{}, 4), make(chan struct{}, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- struct{}{}
		w.Header().Set("Content-Length", strconv.Itoa(len(img)))
		_, _ = w.Write(img[:len(img)/2])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		ended <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	setupID, setupSecret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddRole("Tmpl", []string{"Datastore.AllocateTemplate"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddRole("Net", []string{"Sys.AccessNetwork"}); err != nil {
		t.Fatal(err)
	}
	token := func(user, name string) []string {
		t.Helper()
		id, sec, err := e.s.AddToken(user, name, false)
		if err != nil {
			t.Fatal(err)
		}
		return []string{"Authorization", "PVEAPIToken=" + id + "=" + sec}
	}
	for _, u := range []string{"dl@pve", "other@pve"} {
		if err := e.s.AddUser(u, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.s.SetACL("/storage/local", "dl@pve", "Tmpl", false); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetACL("/nodes/pve", "dl@pve", "Net", false); err != nil {
		t.Fatal(err)
	}
	owner, sibling, stranger := token("dl@pve", "dltok"), token("dl@pve", "second"), token("other@pve", "tok")
	setup := []string{"Authorization", "PVEAPIToken=" + setupID + "=" + setupSecret}

	start := func(name string) string {
		t.Helper()
		r := e.do("POST", "/nodes/pve/storage/local/download-url", url.Values{"content": {"import"}, "filename": {name},
			"url": {srv.URL + "/" + name}, "checksum": {sha256Hex(img)}, "checksum-algorithm": {"sha256"}}, authNone, owner...)
		if r.status != 200 {
			t.Fatalf("download: %d %q", r.status, r.reason)
		}
		upid := r.body["data"].(string)
		<-asked // running: its wget has begun
		return upid
	}
	stop := func(upid string, auth []string) resp {
		t.Helper()
		return e.do("DELETE", "/nodes/pve/tasks/"+url.PathEscape(upid), nil, authNone, auth...)
	}
	status := func(upid string) map[string]any {
		t.Helper()
		return e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any)
	}

	upid := start("a.qcow2")
	for name, auth := range map[string][]string{"another user's token": stranger, "another token of the owner's user": sibling} {
		if r := stop(upid, auth); r.status != 403 {
			t.Errorf("%s stops the task: %d %q, want 403", name, r.status, r.reason)
		}
	}
	if st := status(upid); st["status"] != "running" {
		t.Fatalf("after the refused stops: %v, want running", st)
	}
	if r := stop(upid, owner); r.status != 200 || r.body["data"] != nil {
		t.Fatalf("the owner's stop: %d %q %v", r.status, r.reason, r.body)
	}
	// the stop returns once the worker is gone
	if st := status(upid); st["status"] != "stopped" || st["exitstatus"] != "download failed: received interrupt" {
		t.Fatalf("stopped task: %v", st)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the download's request did not end")
	}
	if left := leftovers(t, e.importDir()); len(left) != 0 {
		t.Errorf("left on the storage: %v", left)
	}
	if r := stop(upid, owner); r.status != 200 {
		t.Errorf("stopping a task that has ended: %d %q", r.status, r.reason)
	}
	if r := stop("UPID:bad", owner); r.status != 400 {
		t.Errorf("a malformed UPID: %d %q", r.status, r.reason)
	}

	// the daemon's token holds Sys.Modify on the node (PVEInspectNode)
	other := start("b.qcow2")
	if r := stop(other, setup); r.status != 200 {
		t.Fatalf("pve-access-setup's token: %d %q", r.status, r.reason)
	}
	if st := e.wait(other); st != "download failed: received interrupt" {
		t.Errorf("stopped by the node's Sys.Modify: %s", st)
	}
	if left := leftovers(t, e.importDir()); len(left) != 0 {
		t.Errorf("left on the storage: %v", left)
	}
}

// TestTaskCallsCheckInProxmoxOrder: pve-manager API2/Tasks.pm
// read_task_log checks the caller before it looks for the task (the
// UPID's user owns it, else Sys.Audit on /nodes/{node}), so a token
// without Sys.Audit asking for the log of a task that does not exist is
// refused (403), where the emulator answered "no such task" (400); the
// owner named in such a UPID gets dump_logfile's line for a file it
// cannot open. read_task_status and stop_task look for the task's log
// file first: the same token gets their 400 "no such task", and 403 for
// another's task that exists.
func TestTaskCallsCheckInProxmoxOrder(t *testing.T) {
	e := newEnv(t)
	if err := e.s.AddUser("nobody@pve", ""); err != nil {
		t.Fatal(err)
	}
	id, sec, err := e.s.AddToken("nobody@pve", "tok", false)
	if err != nil {
		t.Fatal(err)
	}
	nobody := []string{"Authorization", "PVEAPIToken=" + id + "=" + sec}
	task := func(u string) string { return "/nodes/pve/tasks/" + url.PathEscape(u) }
	const missing = "UPID:pve:00000001:00000001:00000001:qmstart:1:root@pam:"
	own := "UPID:pve:00000001:00000001:00000001:qmstart:1:" + id + ":"
	// a task that exists, root's
	r := e.do("POST", "/nodes/pve/qemu/"+strconv.Itoa(templateID)+"/clone", url.Values{"newid": {"121"}}, authTicket)
	upid, _ := r.body["data"].(string)
	if r.status != 200 || upid == "" {
		t.Fatalf("clone: %d %q", r.status, r.reason)
	}
	e.wait(upid)
	for _, tc := range []struct {
		name, method, path string
		auth               []string
		status             int
		upidErr            string
	}{
		{"log of another's missing task", "GET", task(missing) + "/log", nobody, 403, ""},
		{"log of another's task", "GET", task(upid) + "/log", nobody, 403, ""},
		{"log of a malformed UPID", "GET", task("UPID:bad") + "/log", nobody, 400, "unable to parse worker upid"},
		{"status of another's missing task", "GET", task(missing) + "/status", nobody, 400, "no such task"},
		{"status of another's task", "GET", task(upid) + "/status", nobody, 403, ""},
		{"stop of another's missing task", "DELETE", task(missing), nobody, 400, "no such task"},
		{"stop of another's task", "DELETE", task(upid), nobody, 403, ""},
	} {
		r := e.do(tc.method, tc.path, nil, authNone, tc.auth...)
		if r.status != tc.status || (tc.upidErr != "" && r.errors()["upid"] != tc.upidErr) {
			t.Errorf("%s: %d %q %v, want %d %s", tc.name, r.status, r.reason, r.body, tc.status, tc.upidErr)
		}
	}
	r = e.do("GET", task(own)+"/log", nil, authNone, nobody...)
	if lines, _ := r.body["data"].([]any); r.status != 200 || len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0]), "unable to open file - No such file or directory") {
		t.Errorf("log of the caller's own missing task: %d %q %v, want dump_logfile's unable to open file", r.status, r.reason, r.body)
	}
}

// TestStopDownloadDuringChecksum: a stop while the download-url worker
// hashes its fetched file (download_file_from_url's checksum step, inside
// its eval) ends the task as the interrupted worker does: the SIGTERM
// handler's die "received interrupt" (RESTEnvironment.pm fork_worker),
// and the eval's cleanup removes the temporary file, so nothing is left.
// The step printed "calculating checksum..." without a newline (its
// "OK, checksum verified" ends the line), so fork_worker's "TASK ERROR:
// received interrupt" ends that line, and pve-common UPID.pm read_status,
// which matches the log's last line against ^TASK ERROR: , answers
// "unexpected status": the task's exit status (review 52; the emulator
// said "received interrupt"). The emulator finished such a task OK before
// review 51. A worker let through the checksum step renames its file into
// place.
func TestStopDownloadDuringChecksum(t *testing.T) {
	img := qcow2Image(1 << 20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(img) }))
	t.Cleanup(srv.Close)
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	held, release := e.s.HoldDownloadChecksums()
	defer release()
	start := func(name string) (upid, tmp string) {
		t.Helper()
		upid, _ = e.ok("POST", "/nodes/pve/storage/local/download-url", url.Values{"content": {"import"}, "filename": {name},
			"url": {srv.URL + "/" + name}, "checksum": {sha256Hex(img)}, "checksum-algorithm": {"sha256"}}).(string)
		select {
		case tmp = <-held:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: its checksum step never began", name)
		}
		if _, err := os.Stat(tmp); err != nil {
			t.Fatalf("the fetched file in the checksum step: %v", err)
		}
		return upid, tmp
	}

	upid, _ := start("a.qcow2")
	e.ok("DELETE", "/nodes/pve/tasks/"+url.PathEscape(upid), nil)
	if st := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any); st["status"] != "stopped" || st["exitstatus"] != "unexpected status" {
		t.Fatalf("a download stopped in its checksum step: %v, want stopped, unexpected status", st)
	}
	lines, _ := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/log", nil).([]any)
	if len(lines) == 0 || fmt.Sprint(lines[len(lines)-1].(map[string]any)["t"]) != "calculating checksum...TASK ERROR: received interrupt" {
		t.Errorf("the stopped download's log: %v, want its last line calculating checksum...TASK ERROR: received interrupt", lines)
	}
	if left := leftovers(t, e.importDir()); len(left) != 0 {
		t.Errorf("left on the storage: %v", left)
	}

	upid, tmp := start("b.qcow2")
	release()
	if st := e.wait(upid); st != "OK" {
		t.Fatalf("a download let through its checksum step: %s", st)
	}
	if left := leftovers(t, e.importDir()); len(left) != 1 || left[0] != "b.qcow2" || filepath.Base(tmp) == left[0] {
		t.Errorf("after the download: %v, want b.qcow2 alone", left)
	}
}
