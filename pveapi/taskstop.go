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
// task's status could not be read) before it saw the task end: the task
// may still run. Its message is Err's.
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
