package templatebuild_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestBuildKaliTimeout: an archive whose server sends part of it and then
// no more (as slowly as one byte every few minutes, under the stall
// detector's 5 minutes) holds the build only until its Timeout: the build
// fails naming the limit and the step (image), the download's request
// ends, nothing is left on the node, and the image's lock is free again.
func TestBuildKaliTimeout(t *testing.T) {
	e, r, archive, ended := stalledKali(t, 3)
	locks := t.TempDir()
	const limit = 8 * time.Second // generous: the steps before the image run on a loaded CI machine too
	_, out, err := e.buildWith(t, context.Background(), templatebuild.Options{Name: "kali", Recipe: r, LockDir: locks, Timeout: limit})
	var te *templatebuild.TimeoutError
	if !errors.As(err, &te) || te.Step != "image" || te.Limit != limit || !strings.Contains(err.Error(), "stopped in step image") {
		t.Fatalf("a build whose archive stalls: %v, want a timeout in step image\n%s", err, out)
	}
	e.leftNothing(t, ended)
	if _, err := lockImageFile(t, locks, r, archive); err != nil {
		t.Errorf("the image's lock after the timeout: %v, want it free", err)
	}
}

// TestServiceBuildTimeout: a daemon's build past [templates]
// build_timeout (Options.Timeout) fails naming the limit and the step it
// was in (its agent never answers), publishes its failure, and gives back
// what it held: its build slot (a build queued behind it runs), its
// name's lock (the CLI's too); its VM is left tagged building, as at a
// shutdown, and the next build of the name destroys it and builds.
func TestServiceBuildTimeout(t *testing.T) {
	locks := t.TempDir()
	const limit = 15 * time.Second // generous: the build must reach its agent step before it (a loaded CI machine)
	n := newServiceNodeWith(t, func(o *templatebuild.ServiceOptions) {
		o.Defaults.Timeout, o.LockDir = limit, locks
	})
	ctx := context.Background()
	if _, err := n.svc.Start(ctx, n.fromURL("slow")); err != nil {
		t.Fatal(err)
	}
	<-n.agent.asked // the gate stays shut: the agent never answers
	if st, err := n.svc.Start(ctx, n.fromURL("next")); err != nil || st.State != apitype.BuildQueued {
		t.Fatalf("a build behind it: %+v %v, want queued", st, err)
	}
	failed := n.waitEnded(t, "slow")
	if failed.State != apitype.BuildFailed {
		t.Fatalf("the build past its timeout: %+v", failed)
	}
	for _, want := range []string{"stopped in step agent", limit.String(), "[templates] build_timeout"} {
		if !strings.Contains(failed.Error, want) {
			t.Errorf("error %q does not say %q", failed.Error, want)
		}
	}
	if f := n.ev.wait(t, apitype.EventTemplateBuildFailed, 1); len(f) == 0 || f[0].Template != "slow" || !strings.Contains(f[0].Detail, "stopped in step agent") {
		t.Errorf("failed events: %+v", f)
	}
	left := n.vmsNamed(t, "slow")
	if len(left) != 1 || !slices.Contains(left[0].Tags, templatebuild.TagBuilding) {
		t.Errorf("VMs of the timed-out build: %+v, want one tagged %s", left, templatebuild.TagBuilding)
	}
	unlock, err := templatebuild.Lock(locks, "slow")
	if err != nil {
		t.Fatalf("the name's lock after the timeout: %v, want it free", err)
	}
	unlock()
	// the slot is free: the queued build runs
	deadline := time.Now().Add(time.Minute)
	for {
		st, _ := n.svc.Build("next")
		if st.State != apitype.BuildQueued {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the build behind it never left the queue: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// a daemon whose agent answers resumes the name (the build ledger and
	// the lock directory are the node's)
	again := startServiceWith(t, n.emuNode, "", n.sum, func(o *templatebuild.ServiceOptions) { o.LockDir = locks })
	close(again.agent.gate)
	if _, err := again.svc.Start(ctx, again.fromURL("slow")); err != nil {
		t.Fatal(err)
	}
	done := again.waitState(t, "slow", apitype.BuildDone)
	if want := "VM " + strconv.Itoa(left[0].VMID) + " is a half-built"; !strings.Contains(strings.Join(done.Progress, "\n"), want) {
		t.Errorf("the next build of the name: %+v, want %q", done.Progress, want)
	}
	if vms := again.vmsNamed(t, "slow"); len(vms) != 1 || !vms[0].Template {
		t.Errorf("VMs named slow: %+v, want the template alone", vms)
	}
}

// TestBuildTimeoutStopsDownload: a build past its Timeout while Proxmox's
// download-url task fetches an image whose server sent half of it and
// waits stops that task (DELETE /nodes/{node}/tasks/{upid}, as the task's
// owner): the task ends as an interrupted worker does, the server sees
// its request end, and the storage holds neither the image nor the
// worker's temporary file.
func TestBuildTimeoutStopsDownload(t *testing.T) {
	img := pveemu.CloudQCOW2(1 << 30)
	ended := make(chan struct{}, 1)
	e := newEmuNodeServing(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(img)))
		_, _ = w.Write(img[:len(img)/2])
		w.(http.Flusher).Flush()
		<-req.Context().Done()
		ended <- struct{}{}
	}))
	sum := sha256.Sum256(img)
	r := templatebuild.Generic(templatebuild.Image{URL: e.images.URL + "/images/cloud.qcow2", File: "cloud.qcow2", Checksum: "sha256:" + hex.EncodeToString(sum[:])})
	const limit = 8 * time.Second // generous: the steps before the image run on a loaded CI machine too
	_, out, err := e.buildWith(t, context.Background(), templatebuild.Options{Name: "stalled", Recipe: r, Timeout: limit})
	var te *templatebuild.TimeoutError
	if !errors.As(err, &te) || te.Step != "image" {
		t.Fatalf("a build whose image stalls: %v, want a timeout in step image\n%s", err, out)
	}
	m := regexp.MustCompile(`stopped Proxmox's download task (UPID:\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the build does not say it stopped the download:\n%s", out)
	}
	stopped := 0
	for _, rq := range e.s.Requests() {
		if rq.Method == http.MethodDelete && strings.HasPrefix(rq.Path, "/nodes/pve/tasks/") {
			stopped++
		}
	}
	if stopped != 1 {
		t.Errorf("%d task stops, want 1", stopped)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if st, err := e.s.WaitTask(ctx, m[1]); err != nil || st != "download failed: received interrupt" {
		t.Errorf("the download task: %q %v, want an interrupted worker's status", st, err)
	}
	e.leftNothing(t, ended)
	cfg, err := e.px.Storage(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(filepath.Join(cfg.Path, "import")); err != nil || len(left) != 0 {
		t.Errorf("the storage's import directory: %v %v, want empty (no temporary file)", left, err)
	}
}
