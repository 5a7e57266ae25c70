package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// EventsRequest selects the events of Events: empty lists match all.
type EventsRequest struct {
	Sandboxes []string
	Types     []string
	// LastEventID resumes after that event; Resume must be set for 0 to
	// mean "everything buffered" rather than "from now on".
	LastEventID uint64
	Resume      bool
}

// maxEventLine bounds one line of the stream.
const maxEventLine = 1 << 20

// Events follows GET /v1/events and calls fn with each event until ctx
// ends, the stream ends or fn returns an error (which Events returns).
// A gap event (Type apitype.EventGap) says events were lost.
func (c *Client) Events(ctx context.Context, r EventsRequest, fn func(apitype.Event) error) error {
	q := url.Values{}
	if len(r.Sandboxes) > 0 {
		q.Set("sandbox", strings.Join(r.Sandboxes, ","))
	}
	if len(r.Types) > 0 {
		q.Set("type", strings.Join(r.Types, ","))
	}
	path := "/v1/events"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	req, err := c.newRequest(ctx, "GET", path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if r.Resume || r.LastEventID != 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(r.LastEventID, 10))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET /v1/events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeProblem(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventLine)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() == 0 {
				continue
			}
			var e apitype.Event
			if err := json.Unmarshal([]byte(data.String()), &e); err != nil {
				return fmt.Errorf("GET /v1/events: decode event: %w", err)
			}
			data.Reset()
			if err := fn(e); err != nil {
				return err
			}
		case strings.HasPrefix(line, "data:"):
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("GET /v1/events: %w", err)
	}
	return ctx.Err()
}
