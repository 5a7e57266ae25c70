package qga

import (
	"context"
	"testing"
	"time"
)

func TestSmoke(t *testing.T) {
	g := startGuest(t)
	c := New(Options{})
	a := c.Agent(g.Socket)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := a.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("version %s, %d commands", in.Version, len(in.Commands))
	t0 := time.Now()
	res, err := a.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo hi; echo err >&2; exit 3"}})
	t.Logf("%v %+v %q %q", time.Since(t0), res, res.Stdout, res.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	res, err = a.Exec(ctx, ExecRequest{Argv: []string{"true"}})
	t.Logf("true: %v %+v", time.Since(t0), err)
}
