package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestInProcess: the in-process client sends the token, reads answers as
// they are written, turns problems into *apitype.Problem, and a caller
// that gives up ends the handler's request.
func TestInProcess(t *testing.T) {
	handlerStarted, handlerDone := make(chan struct{}), make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/healthz", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"type":"unauthorized","status":401}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok","node":"n1"}`)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/vms/{vm}/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		for _, l := range []string{`{"type":"stdout","data":"b25l"}`, `{"type":"stderr","data":"dHdv"}`, `{"type":"exit","result":{"exit_code":3,"stdout":null,"stderr":null}}`} {
			_, _ = io.WriteString(w, l+"\n")
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		close(handlerStarted)
		<-r.Context().Done() // a handler that only ends when the caller gives up
		handlerDone <- r.Context().Err()
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client.NewInProcess(mux, client.WithToken("tok"))
	if h, err := c.Health(ctx); err != nil || h.Node != "n1" {
		t.Fatalf("health: %+v %v", h, err)
	}
	if _, err := client.NewInProcess(mux).Health(ctx); !client.IsProblem(err, apitype.ProblemUnauthorized) {
		t.Errorf("without token: %v", err)
	}
	var out, errb strings.Builder
	res, err := c.ExecStream(ctx, "sb", "vm0", apitype.ExecRequest{Argv: []string{"x"}}, &out, &errb)
	if err != nil || res.ExitCode != 3 || out.String() != "one" || errb.String() != "two" {
		t.Fatalf("stream: %+v %v %q %q", res, err, out.String(), errb.String())
	}

	gctx, gcancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() { _, err := c.Get(gctx, "sb"); got <- err }()
	<-handlerStarted
	gcancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled get: %v", err)
	}
	select {
	case err := <-handlerDone:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("handler saw %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the handler did not end when the caller gave up")
	}
}
