package pveapi

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// StopTaskTimeout bounds StopTask: Proxmox's stop waits up to 5 seconds
// for the worker to end before it kills it (pve-common RESTEnvironment.pm
// $kill_process_group).
const StopTaskTimeout = 30 * time.Second

// TaskUnfinishedError is the failure of a call that started a Proxmox task
// and stopped waiting for it (its context ended, its wait timed out, or the
// task's status could not be read for Options.TaskStatusGrace) before it
// saw the task end: the task may still run. Its message is Err's.
type TaskUnfinishedError struct {
	// UPID is the task's id, for StopTask.
	UPID string
	Err  error
}

func (e *TaskUnfinishedError) Error() string { return e.Err.Error() }

// Unwrap returns the wait's failure (a context's error among them).
func (e *TaskUnfinishedError) Unwrap() error { return e.Err }

// StopTask stops the task upid (DELETE /nodes/{node}/tasks/{upid} on the
// task's node: pve-manager API2/Tasks.pm stop_task, which SIGTERMs the
// worker's process group and SIGKILLs it 5 seconds later). The task's
// owner needs no privilege (an API token owns the tasks it started, a user
// the tasks it and its tokens started); anyone else needs Sys.Modify on
// /nodes/{node}. A task that has already ended is not an error. ctx's
// values are kept but not its end: a caller whose own context is done
// (a cancelled build) still stops the task it started, for at most
// StopTaskTimeout.
func (c *Client) StopTask(ctx context.Context, upid string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopTaskTimeout)
	defer cancel()
	f := strings.Split(upid, ":")
	if len(f) < 9 || f[0] != "UPID" || f[1] == "" {
		return fmt.Errorf("stop task %s: not a UPID", upid)
	}
	p := fmt.Sprintf("/nodes/%s/tasks/%s", url.PathEscape(f[1]), url.PathEscape(upid))
	if err := c.c.Delete(ctx, p, nil); err != nil {
		return classify("stop task "+upid, err)
	}
	return nil
}

// startGrace is how long a POST that starts a task may outlive its
// caller's context (startAndWait): Proxmox answers it once the worker is
// forked.
const startGrace = 30 * time.Second

// startAndWait is call for a POST that starts a task its caller may have
// to stop: the POST is not cut short when ctx ends (for at most
// startGrace more), since Proxmox forks the worker whether or not its
// answer is read (RESTEnvironment.pm fork_worker), and a caller that never
// learns the UPID cannot stop the task. With the UPID, the wait fails as
// soon as ctx is done with a *TaskUnfinishedError naming it.
func (c *Client) startAndWait(ctx context.Context, op, path string, body any) error {
	pctx, cancel := outliving(ctx, startGrace)
	defer cancel()
	var upid any
	if err := c.c.Post(pctx, path, body, &upid); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// the caller's end is the failure; the POST's says why no
			// task id came back
			return classify(op, fmt.Errorf("%w (the task it may have started is unknown: %w)", cerr, err))
		}
		return classify(op, err)
	}
	if s, ok := upid.(string); ok && strings.HasPrefix(s, "UPID:") {
		return c.wait(ctx, op, s, nil)
	}
	return nil
}

// outliving returns a context with ctx's values that ends grace after ctx
// does, or at its cancel. The goroutine context.AfterFunc starts once ctx
// is done ends at the grace or at the cancel.
func outliving(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-octx.Done():
		}
	})
	return octx, func() {
		stop()
		cancel()
	}
}
