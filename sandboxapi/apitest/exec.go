package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// ExecAnswer is how one exec call answered: its HTTP status (-1: the call
// failed before an answer), Retry-After header, problem type and the
// quota a refusal names.
type ExecAnswer struct {
	Code  int
	Retry string
	Type  string
	Quota string
}

// PostExec posts an exec of req to VM vm of sandbox id at the API at url
// as token tok (streamed as NDJSON when stream) and returns how it
// answered once the whole answer is in: a running exec returns when it
// ends. Quota tests tell a held call from a refused one by it.
func PostExec(ctx context.Context, url, tok, id, vm string, req apitype.ExecRequest, stream bool) ExecAnswer {
	body, err := json.Marshal(req)
	if err != nil {
		return ExecAnswer{Code: -1}
	}
	hr, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/sandboxes/"+id+"/vms/"+vm+"/exec", bytes.NewReader(body))
	if err != nil {
		return ExecAnswer{Code: -1}
	}
	hr.Header.Set("Authorization", "Bearer "+tok)
	hr.Header.Set("Content-Type", "application/json")
	if stream {
		hr.Header.Set("Accept", "application/x-ndjson")
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return ExecAnswer{Code: -1}
	}
	defer resp.Body.Close()
	var p apitype.Problem
	if resp.StatusCode != http.StatusOK {
		_ = json.NewDecoder(resp.Body).Decode(&p)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return ExecAnswer{Code: resp.StatusCode, Retry: resp.Header.Get("Retry-After"), Type: p.Type, Quota: p.Quota}
}
