package bench

import (
	"context"
	"log/slog"
	"net/http/httptest"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// Serve reconciles eng and puts its sandbox API (options o; no Logger: a
// discarding one) behind a loopback HTTP server (the local handler, as
// the unix socket serves it). It returns a client of it and the server's
// close.
func Serve(ctx context.Context, eng *sandbox.Engine, o sandboxapi.Options) (*client.Client, func(), error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := sandboxapi.New(eng, o)
	if err != nil {
		return nil, nil, err
	}
	if _, err := eng.Reconcile(ctx); err != nil {
		return nil, nil, err
	}
	hs := httptest.NewServer(srv.LocalHandler())
	return client.New(hs.URL), hs.Close, nil
}
