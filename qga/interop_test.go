package qga

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// proxmoxPing behaves like Proxmox's own agent client: a new connection per
// command, guest-sync-delimited, then guest-ping, all within 3 s.
func proxmoxPing(socket string) error {
	deadline := time.Now().Add(3 * time.Second)
	var c net.Conn
	for {
		var err error
		c, err = net.DialTimeout("unix", socket, time.Until(deadline))
		if err == nil {
			break
		}
		// A blocking connect would wait in the backlog; Go's unix dial
		// reports the full backlog as EAGAIN instead.
		if !errors.Is(err, syscall.EAGAIN) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	id := 100000 + mrand.IntN(900000)
	if _, err := fmt.Fprintf(c, "\xff{\"execute\":\"guest-sync-delimited\",\"arguments\":{\"id\":%d}}\n", id); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	for {
		if _, err := br.ReadBytes(0xFF); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		line, err := br.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		if bytes.Equal(bytes.TrimSpace(line), fmt.Appendf(nil, `{"return": %d}`, id)) {
			break
		}
	}
	if _, err := c.Write([]byte("{\"execute\":\"guest-ping\"}\n")); err != nil {
		return err
	}
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if !bytes.Equal(bytes.TrimSpace(line), []byte(`{"return": {}}`)) {
		return fmt.Errorf("ping answered %q", line)
	}
	return nil
}

// TestProxmoxPingsInterleave: while the client streams a large file in and
// out, a Proxmox-like client pinging the same socket with a 3 s timeout
// keeps succeeding.
func TestProxmoxPingsInterleave(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	data := make([]byte, 96<<20)
	rand.Read(data)

	stop := make(chan struct{})
	var ok, failed atomic.Int32
	var firstErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if err := proxmoxPing(g.Socket); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			} else {
				ok.Add(1)
			}
		}
	}()
	ctx := testCtx(t, 10*time.Minute)
	werr := a.WriteFile(ctx, g.Dir+"/big", bytes.NewReader(data), 0o644)
	var got bytes.Buffer
	var rerr error
	if werr == nil {
		_, rerr = a.ReadFile(ctx, g.Dir+"/big", &got, 0)
	}
	close(stop)
	wg.Wait()
	if werr != nil || rerr != nil {
		t.Fatalf("write %v, read %v", werr, rerr)
	}
	if sha(got.Bytes()) != sha(data) {
		t.Fatal("read back differs")
	}
	t.Logf("proxmox pings: %d ok, %d failed", ok.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d Proxmox pings failed, first: %v", failed.Load(), firstErr.Load())
	}
	if ok.Load() < 3 {
		t.Fatalf("only %d pings ran during the transfer; the test proves nothing", ok.Load())
	}
}

// TestParallelGuests: 32 exec and file operations spread over 8 guests, all
// at once, all correct.
func TestParallelGuests(t *testing.T) {
	const guests, ops = 8, 32
	gs := startGuests(t, guests)
	c := New(Options{})
	ctx := testCtx(t, 5*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, ops)
	for i := range ops {
		g := gs[i%guests]
		a := c.Agent(g.Socket)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- parallelOp(ctx, a, g, i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func parallelOp(ctx context.Context, a *Agent, g *testGuest, i int) error {
	payload := make([]byte, 256<<10+i)
	rand.Read(payload)
	switch i % 4 {
	case 0: // file round trip
		p := fmt.Sprintf("%s/par/%d", g.Dir, i)
		if err := a.WriteFile(ctx, p, bytes.NewReader(payload), 0o600); err != nil {
			return fmt.Errorf("op %d write: %w", i, err)
		}
		var got bytes.Buffer
		if _, err := a.ReadFile(ctx, p, &got, 0); err != nil || !bytes.Equal(got.Bytes(), payload) {
			return fmt.Errorf("op %d read: %v (equal %v)", i, err, bytes.Equal(got.Bytes(), payload))
		}
	case 1: // stdin through a file and back
		res, err := a.Exec(ctx, ExecRequest{Argv: []string{"cat"}, Stdin: bytes.NewReader(payload)})
		if err != nil || !bytes.Equal(res.Stdout, payload) {
			return fmt.Errorf("op %d cat: %v", i, err)
		}
	case 2: // exec with per-op output
		res, err := a.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", `echo "op $1"; exit $(($1 % 7))`, "sh", fmt.Sprint(i)}})
		if err != nil || string(res.Stdout) != fmt.Sprintf("op %d\n", i) || res.ExitCode != i%7 {
			return fmt.Errorf("op %d echo: %+v %v", i, res, err)
		}
	case 3: // sha256 computed in the guest
		p := fmt.Sprintf("%s/par/sum%d", g.Dir, i)
		if err := a.WriteFile(ctx, p, bytes.NewReader(payload), 0o600); err != nil {
			return fmt.Errorf("op %d write: %w", i, err)
		}
		res, err := a.Exec(ctx, ExecRequest{Argv: []string{"sha256sum", p}})
		if err != nil || !bytes.HasPrefix(res.Stdout, []byte(sha(payload))) {
			return fmt.Errorf("op %d sha256sum: %v %q", i, err, res.Stdout)
		}
	}
	return nil
}
