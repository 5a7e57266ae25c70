package pveapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// StagedNetworkChanges returns the diff of node's staged host network
// edits (/etc/network/interfaces.new against /etc/network/interfaces), ""
// when none are staged: GET /nodes/{node}/network answers it as the
// result attribute "changes" (pve-manager API2/Network.pm index). Every
// SDN apply reloads every node's network, and a reload renames a staged
// interfaces.new over interfaces first, so whatever is staged on any node
// goes live with the daemon's next apply
// ("" is this client's node).
func (c *Client) StagedNetworkChanges(ctx context.Context, node string) (string, error) {
	if node == "" {
		node = c.node
	}
	var env struct {
		Changes string `json:"changes"`
	}
	if err := c.getEnvelope(ctx, "/nodes/"+url.PathEscape(node)+"/network", &env); err != nil {
		return "", err
	}
	return env.Changes, nil
}

// maxEnvelope bounds an answer read whole by getEnvelope.
const maxEnvelope = 4 << 20

// getEnvelope reads path's whole JSON answer (data and the result
// attributes beside it) into v, with the client's token. go-proxmox
// decodes "data" only.
func (c *Client) getEnvelope(ctx context.Context, path string, v any) error {
	op := "GET " + path
	if c.o.Secret == "" {
		return fmt.Errorf("%s: needs the API token", op)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(c.o.URL, "/")+path, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("Authorization", "PVEAPIToken="+c.o.TokenID+"="+c.o.Secret)
	req.Header.Set("User-Agent", "pve-inspectd")
	res, err := c.hc.Do(req)
	if err != nil {
		return classify(op, err)
	}
	return readEnvelope(op, res, v)
}

// readEnvelope reads res's whole JSON answer (at most maxEnvelope bytes)
// into v, or returns Proxmox's refusal (its message) naming op; res's
// body is closed.
func readEnvelope(op string, res *http.Response, v any) error {
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxEnvelope+1))
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if len(body) > maxEnvelope {
		return fmt.Errorf("%s: answer larger than %d bytes", op, maxEnvelope)
	}
	if res.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(body, &e)
		msg := strings.TrimSpace(e.Message)
		if msg == "" {
			msg = res.Status
		}
		return fmt.Errorf("%s: %d %s", op, res.StatusCode, msg)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
