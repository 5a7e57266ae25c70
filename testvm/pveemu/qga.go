package pveemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"
)

// qgaClient is the emulator's own minimal QEMU guest agent client: one
// connection per command, resynchronised with guest-sync-delimited, every
// read bounded in size and time. It is the default Agent.
type qgaClient struct{}

const (
	qgaMaxReply   = 32 << 20
	qgaDefaultTTL = 10 * time.Second
)

// Call implements Agent.
func (qgaClient) Call(ctx context.Context, socket, command string, args any) (json.RawMessage, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, qgaDefaultTTL)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connect agent: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	id := rand.IntN(99999) + 1
	sync, _ := json.Marshal(map[string]any{"execute": "guest-sync-delimited", "arguments": map[string]any{"id": id}})
	if _, err := conn.Write(append([]byte{0xff}, append(sync, '\n')...)); err != nil {
		return nil, fmt.Errorf("agent sync: %w", err)
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	// Discard everything up to the 0xFF delimiter, then find our sync id.
	if _, err := r.ReadSlice(0xff); err != nil && !errors.Is(err, bufio.ErrBufferFull) {
		return nil, fmt.Errorf("agent sync: %w", err)
	}
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, fmt.Errorf("agent sync: %w", err)
		}
		var rep struct {
			Return json.Number `json:"return"`
		}
		if json.Unmarshal(line, &rep) == nil && rep.Return.String() == fmt.Sprint(id) {
			break
		}
	}
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	msg, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", command, err)
	}
	if _, err := conn.Write(append(msg, '\n')); err != nil {
		return nil, fmt.Errorf("send %s: %w", command, err)
	}
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, fmt.Errorf("read %s reply: %w", command, err)
		}
		var rep struct {
			Return json.RawMessage `json:"return"`
			Error  *AgentError     `json:"error"`
		}
		if err := json.Unmarshal(line, &rep); err != nil {
			return nil, fmt.Errorf("%s reply: %w", command, err)
		}
		if rep.Error != nil {
			return nil, rep.Error
		}
		if rep.Return != nil {
			return rep.Return, nil
		}
	}
}

func readLine(r *bufio.Reader) ([]byte, error) {
	var buf bytes.Buffer
	for {
		chunk, err := r.ReadSlice('\n')
		buf.Write(chunk)
		if buf.Len() > qgaMaxReply {
			return nil, errors.New("agent reply too large")
		}
		if err == nil {
			line := bytes.TrimSpace(buf.Bytes())
			if len(line) == 0 {
				buf.Reset()
				continue
			}
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}
