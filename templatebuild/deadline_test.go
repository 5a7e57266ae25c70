package templatebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
)

// stalledPVE is a node whose download-url never ends until its caller
// gives up: Proxmox's wget of a source that sends a byte every few
// minutes.
type stalledPVE struct{ *fakePVE }

func (s stalledPVE) DownloadURL(ctx context.Context, storage string, d pveapi.Download) (string, error) {
	s.mu.Lock()
	s.note("download %s (stalled)", d.URL)
	s.mu.Unlock()
	<-ctx.Done()
	return "", &pveapi.TaskUnfinishedError{UPID: stalledUPID, Err: fmt.Errorf("download %s to %s: %w", d.Filename, storage, ctx.Err())}
}

// stalledUPID is the task stalledPVE's download-url started.
const stalledUPID = "UPID:pve:00001234:00005678:6560A000:download:pvei-x.qcow2:root@pam:"

// TestBuildTimeout: a build that runs past its Timeout stops in the step
// it is in (a download that never ends, an agent that never answers) and
// fails with a *TimeoutError naming the limit and that step (a deadline
// exceeded), and leaves what a cancelled build leaves: its VM, tagged
// building, kept when KeepCancelled (the daemon) for the next build to
// destroy, else destroyed (the CLI). The next build of the name resumes.
func TestBuildTimeout(t *testing.T) {
	debian := Recipes()["debian13"]
	for _, tc := range []struct {
		name      string
		stalled   bool
		agentDown bool
		keep      bool
		timeout   time.Duration
		step      string
		// calls must appear; noCalls must not; vms are the VMs left.
		calls, noCalls []string
		vms            []int
	}{
		{name: "a download that never ends", stalled: true, timeout: time.Second, step: "image",
			calls: []string{"download"}, noCalls: []string{"create", "delete"}},
		{name: "an agent that never answers, the daemon's build", agentDown: true, keep: true, timeout: 2 * time.Second, step: "agent",
			calls: []string{"create 100", "start 100"}, noCalls: []string{"delete", "template"}, vms: []int{100}},
		{name: "an agent that never answers, the CLI's build", agentDown: true, timeout: 2 * time.Second, step: "agent",
			calls: []string{"create 100", "start 100", "delete 100"}, noCalls: []string{"template"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			var px Proxmox = w.pve
			if tc.stalled {
				px = stalledPVE{w.pve}
			}
			w.agent.down = tc.agentDown
			var out bytes.Buffer
			b, err := New(px, w.agent, w.host, Options{Name: "t1", Recipe: debian, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
				Bridge: "vmbr0", KeepCancelled: tc.keep, AgentWait: time.Hour, AgentPoll: time.Millisecond, Timeout: tc.timeout, Progress: &out})
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Run(context.Background())
			var te *TimeoutError
			if !errors.As(err, &te) || te.Step != tc.step || te.Limit != tc.timeout || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("build: %v (%#v), want a timeout of %s in step %s\n%s", err, te, tc.timeout, tc.step, out.String())
			}
			for _, want := range []string{"stopped in step " + tc.step, tc.timeout.String(), "[templates] build_timeout"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "did not answer within") {
				t.Errorf("error %q blames the agent's wait, not the build's timeout", err)
			}
			calls := strings.Join(w.pve.calls, "\n")
			for _, c := range tc.calls {
				if !strings.Contains(calls, c) {
					t.Errorf("no call %q in:\n%s", c, calls)
				}
			}
			for _, c := range tc.noCalls {
				if slices.ContainsFunc(w.pve.calls, func(got string) bool { return strings.HasPrefix(got, c) }) {
					t.Errorf("unexpected call %q in:\n%s", c, calls)
				}
			}
			var ids []int
			for id, c := range w.pve.vms {
				ids = append(ids, id)
				if c["tags"] != TagBuilding {
					t.Errorf("VM %d left tagged %q, want %s", id, c["tags"], TagBuilding)
				}
			}
			slices.Sort(ids)
			if !slices.Equal(ids, tc.vms) {
				t.Errorf("VMs left %v, want %v", ids, tc.vms)
			}
			if len(w.host.files) != 0 {
				t.Errorf("snippets left: %v", w.host.files)
			}

			// the next build of the name, in time, resumes
			w.agent.down = false
			w.pve.calls = nil
			again, err := New(w.pve, w.agent, w.host, Options{Name: "t1", Recipe: debian, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
				Bridge: "vmbr0", AgentPoll: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			res, err := again.Run(context.Background())
			if err != nil || w.pve.vms[res.VMID]["template"] != "1" {
				t.Fatalf("the next build: %+v %v", res, err)
			}
			if kept := len(tc.vms) > 0; kept != slices.Contains(w.pve.calls, "delete 100") {
				t.Errorf("the next build's calls %q: want the kept VM (%v) destroyed first", w.pve.calls, tc.vms)
			}
		})
	}
	if _, err := New(newFakePVE(), &fakeAgent{}, newFakeHost(), Options{Name: "t1", Recipe: debian, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Timeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "build timeout") {
		t.Errorf("a negative timeout: %v, want refused", err)
	}
}

// inFlightCreatePVE is a node whose create task outlives its caller:
// qemu-server's create_vm writes the VM's config locked "create" before
// its worker (create_and_lock_config), the worker imports the disks
// (create_disks, an OVA's or a cloud image's import-from: minutes to
// hours) and writes the whole config (name, tags) only at its end
// (write_config); a client that stops waiting does not stop the task.
// finish ends the task as Proxmox's worker would.
type inFlightCreatePVE struct {
	*fakePVE
	conf map[int]map[string]string
}

func (s inFlightCreatePVE) CreateVM(ctx context.Context, vmid int, conf map[string]string) error {
	s.mu.Lock()
	s.note("create %d (in flight)", vmid)
	s.vms[vmid] = map[string]string{"lock": "create"}
	s.conf[vmid] = conf
	s.mu.Unlock()
	<-ctx.Done()
	return fmt.Errorf("create %d: %w", vmid, ctx.Err())
}

func (s inFlightCreatePVE) finish(t *testing.T) {
	t.Helper()
	for id, conf := range s.conf {
		s.mu.Lock()
		delete(s.vms, id)
		s.mu.Unlock()
		if err := s.fakePVE.CreateVM(context.Background(), id, conf); err != nil {
			t.Fatalf("the create task of VM %d: %v", id, err)
		}
	}
}

// TestBuildTimeoutDuringCreate: a build whose Timeout passes while
// Proxmox's create task imports its disks keeps its ledger's record of
// the VM: the task goes on and writes the VM, named and tagged as the
// build's, and the next build of the name destroys it as a half-built
// one and builds, rather than refusing the name as another's VM (which
// only an operator's qm destroy would clear), for the daemon's build
// (KeepCancelled) and the CLI's alike.
func TestBuildTimeoutDuringCreate(t *testing.T) {
	debian := Recipes()["debian13"]
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("keep cancelled %v", keep), func(t *testing.T) {
			w := newWorld()
			px := inFlightCreatePVE{fakePVE: w.pve, conf: map[int]map[string]string{}}
			var out bytes.Buffer
			b, err := New(px, w.agent, w.host, Options{Name: "t1", Recipe: debian, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
				Bridge: "vmbr0", KeepCancelled: keep, AgentPoll: time.Millisecond, Timeout: time.Second, Progress: &out})
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Run(context.Background())
			var te *TimeoutError
			if !errors.As(err, &te) || te.Step != "create" {
				t.Fatalf("build: %v, want a timeout in step create\n%s", err, out.String())
			}
			px.finish(t) // Proxmox's task ends after the build gave up
			if _, ok, err := w.host.Recorded(100); err != nil || !ok {
				t.Errorf("the ledger's record of VM 100 after the timeout: %v %v, want it kept for the next build", ok, err)
			}

			w.pve.calls = nil
			out.Reset()
			again, err := New(w.pve, w.agent, w.host, Options{Name: "t1", Recipe: debian, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
				Bridge: "vmbr0", AgentPoll: time.Millisecond, Progress: &out})
			if err != nil {
				t.Fatal(err)
			}
			res, err := again.Run(context.Background())
			if err != nil || w.pve.vms[res.VMID]["template"] != "1" {
				t.Fatalf("the next build of the name: %+v %v\n%s", res, err, out.String())
			}
			if !slices.Contains(w.pve.calls, "delete 100") {
				t.Errorf("the next build's calls %q: want the VM its timed-out create made (100) destroyed", w.pve.calls)
			}
			if ids := slices.Sorted(maps.Keys(w.pve.vms)); !slices.Equal(ids, []int{res.VMID}) {
				t.Errorf("VMs left %v, want the template %d alone", ids, res.VMID)
			}
		})
	}
}

// TestDownloadStoppedWhenTheBuildEnds: a build cancelled or past its
// Timeout while Proxmox's download-url task runs stops that task (the
// UPID the call started); a stop that fails is logged and said, and the
// build's error is the one it would have been.
func TestDownloadStoppedWhenTheBuildEnds(t *testing.T) {
	debian := Recipes()["debian13"]
	for _, tc := range []struct {
		name     string
		timeout  bool
		failStop error
	}{
		{name: "cancelled"},
		{name: "past its timeout", timeout: true},
		{name: "cancelled, the stop fails", failStop: errors.New("stop task: 403 Permission check failed")},
		{name: "past its timeout, the stop fails", timeout: true, failStop: errors.New("stop task: 403 Permission check failed")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			w.pve.failStop = tc.failStop
			var out, logs bytes.Buffer
			o := Options{Name: "t1", Recipe: debian, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "vmbr0",
				Progress: &out, Log: slog.New(slog.NewTextHandler(&logs, nil))}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.timeout {
				o.Timeout = time.Second
			} else {
				go func() {
					// cancel once the download is waited for
					for {
						w.pve.mu.Lock()
						started := slices.ContainsFunc(w.pve.calls, func(c string) bool { return strings.HasSuffix(c, "(stalled)") })
						w.pve.mu.Unlock()
						if started {
							cancel()
							return
						}
						time.Sleep(time.Millisecond)
					}
				}()
			}
			b, err := New(stalledPVE{w.pve}, w.agent, w.host, o)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Run(ctx)
			want := context.Canceled
			if tc.timeout {
				want = context.DeadlineExceeded
				var te *TimeoutError
				if !errors.As(err, &te) || te.Step != "image" {
					t.Fatalf("build: %v, want a timeout in step image", err)
				}
			}
			if !errors.Is(err, want) || (tc.failStop != nil && errors.Is(err, tc.failStop)) || strings.Contains(err.Error(), "stop task") {
				t.Fatalf("build: %v, want %v and nothing of the stop", err, want)
			}
			var stops []string
			for _, c := range w.pve.calls {
				if strings.HasPrefix(c, "stop ") {
					stops = append(stops, c)
				}
			}
			if !slices.Equal(stops, []string{"stop " + stalledUPID}) {
				t.Errorf("stops %q, want the download's task once", stops)
			}
			if tc.failStop == nil {
				if !slices.Equal(w.pve.stopped, []string{stalledUPID}) || !strings.Contains(out.String(), "stopped Proxmox's download task "+stalledUPID) {
					t.Errorf("stopped %q, progress:\n%s", w.pve.stopped, out.String())
				}
				if strings.Contains(logs.String(), "level=WARN") {
					t.Errorf("a stop that worked logged a warning:\n%s", logs.String())
				}
				return
			}
			if !strings.Contains(out.String(), "could not stop Proxmox's download task "+stalledUPID) {
				t.Errorf("progress does not say the stop failed:\n%s", out.String())
			}
			if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, stalledUPID) || !strings.Contains(l, "403 Permission check failed") {
				t.Errorf("log does not warn of the task left running:\n%s", l)
			}
		})
	}
}
