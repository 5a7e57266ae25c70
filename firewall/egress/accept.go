package egress

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// serveBounded accepts connections on ln until ctx is done and runs handle
// for each in its own goroutine, at most max at once: a connection past
// that is closed at once (a guest cannot pile up handlers). handle owns
// the connection and closes it. serveBounded returns after every handler
// it started has ended; what names the server in errors.
func serveBounded(ctx context.Context, ln net.Listener, max int, what string, handle func(net.Conn)) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, max)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s: accept: %w", what, err)
		}
		select {
		case sem <- struct{}{}:
		default:
			_ = c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			handle(c)
		}()
	}
}
