package qga

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// maxDescLen bounds the agent's error description kept in an AgentError: it
// is untrusted text that ends up in logs and API answers.
const maxDescLen = 512

// errorBody is the "error" member of a QMP reply.
type errorBody struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// replyEnvelope is one QMP reply line.
type replyEnvelope struct {
	Return json.RawMessage `json:"return"`
	Error  *errorBody      `json:"error"`
	ID     json.RawMessage `json:"id"`
}

// returnSink decodes the "return" member straight into the caller's value
// (one pass over a reply that may be megabytes of base64) and records that
// the member was present.
type returnSink struct {
	seen bool
	out  any
}

func (r *returnSink) UnmarshalJSON(b []byte) error {
	r.seen = true
	if r.out == nil {
		return nil
	}
	return json.Unmarshal(b, r.out)
}

// parseReply checks one reply line (without its trailing newline) against the
// command that was sent with id wantID and decodes its "return" value into
// out (nil to ignore it). An {"error":...} reply comes back as *AgentError;
// everything that is not a strict QMP reply to that id, or whose return
// value does not fit out, comes back as *ProtocolError (Socket unset). A
// reply without an id is refused unless allowNoID.
func parseReply(line []byte, cmd string, wantID uint32, allowNoID bool, out any) error {
	line = bytes.TrimRight(line, "\r")
	if len(line) == 0 || line[0] != '{' {
		return &ProtocolError{Kind: KindMalformed, Command: cmd, Err: fmt.Errorf("reply %s is not a JSON object", clip(line, 32))}
	}
	var env struct {
		Return returnSink      `json:"return"`
		Error  *errorBody      `json:"error"`
		ID     json.RawMessage `json:"id"`
	}
	env.Return.out = out
	if err := json.Unmarshal(line, &env); err != nil {
		return &ProtocolError{Kind: KindMalformed, Command: cmd, Err: fmt.Errorf("reply %s: %w", clip(line, 32), err)}
	}
	if env.Return.seen == (env.Error != nil) {
		return &ProtocolError{Kind: KindMalformed, Command: cmd, Err: fmt.Errorf("reply %s has neither or both of return and error", clip(line, 32))}
	}
	switch {
	case env.ID == nil && allowNoID:
		// An agent older than QEMU 3.0 does not echo ids.
	case env.ID == nil:
		return &ProtocolError{Kind: KindUnsolicited, Command: cmd, Err: errors.New("reply carries no id")}
	case !bytes.Equal(env.ID, strconv.AppendUint(nil, uint64(wantID), 10)):
		return &ProtocolError{Kind: KindWrongID, Command: cmd,
			Err: fmt.Errorf("reply id %s, sent %d", clip(env.ID, 32), wantID)}
	}
	if env.Error != nil {
		return &AgentError{Command: cmd, Class: clipString(env.Error.Class, 64), Desc: clipString(env.Error.Desc, maxDescLen)}
	}
	return nil
}

// parseSyncReply parses the line that follows the 0xFF delimiter of a
// guest-sync-delimited reply and returns the echoed id.
func parseSyncReply(line []byte) (uint32, error) {
	env, err := decodeEnvelope(line)
	if err != nil {
		return 0, err
	}
	if env.Error != nil {
		return 0, fmt.Errorf("sync refused: %s", clipString(env.Error.Desc, maxDescLen))
	}
	id, err := strconv.ParseUint(string(env.Return), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("sync reply %s is not an id", clip(env.Return, 32))
	}
	return uint32(id), nil
}

// decodeEnvelope does the strict part shared by all replies: one JSON object,
// nothing after it, exactly one of "return" and "error".
func decodeEnvelope(line []byte) (*replyEnvelope, error) {
	line = bytes.TrimRight(line, "\r")
	if len(line) == 0 || line[0] != '{' {
		return nil, fmt.Errorf("reply %s is not a JSON object", clip(line, 32))
	}
	var env replyEnvelope
	if err := json.Unmarshal(line, &env); err != nil {
		return nil, fmt.Errorf("reply %s: %w", clip(line, 32), err)
	}
	if (env.Return == nil) == (env.Error == nil) {
		return nil, fmt.Errorf("reply %s has neither or both of return and error", clip(line, 32))
	}
	return &env, nil
}

// clip quotes at most n bytes of untrusted b for an error message.
func clip(b []byte, n int) string {
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "..."
	}
	return strconv.Quote(string(b))
}

// clipString bounds untrusted text kept in errors and makes it valid UTF-8.
func clipString(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "..."
	}
	if !utf8.ValidString(s) {
		s = string(bytes.ToValidUTF8([]byte(s), []byte("?")))
	}
	return s
}
