package pveemu

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// maxReadSize is qemu-server's $MAX_READ_SIZE for agent/file-read.
const maxReadSize = 16 * 1024 * 1024

// agentAvailable is PVE::QemuServer::Agent::assert_agent_available.
func (s *Server) agentAvailable(ctx context.Context, vmid int) (string, error) {
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	var configured, running bool
	if err == nil {
		_, configured = v.conf["agent"]
		running = v.running
	}
	s.mu.Unlock()
	if err != nil {
		return "", err
	}
	if !configured {
		return "", fail("No QEMU guest agent configured")
	}
	if !running {
		return "", fail("VM %d is not running", vmid)
	}
	sock := s.backendOf(vmid).AgentSocket(vmid)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := s.agent.Call(pctx, sock, "guest-ping", nil); err != nil {
		var ae *AgentError
		if !errors.As(err, &ae) {
			return "", fail("QEMU guest agent is not running")
		}
	}
	return sock, nil
}

// agentCmd is agent_cmd: availability check, command, error check.
func (s *Server) agentCmd(ctx context.Context, vmid int, cmd string, args any, errmsg string) (json.RawMessage, error) {
	sock, err := s.agentAvailable(ctx, vmid)
	if err != nil {
		return nil, err
	}
	return s.monCmd(ctx, vmid, sock, cmd, args, errmsg)
}

func (s *Server) monCmd(ctx context.Context, vmid int, sock, cmd string, args any, errmsg string) (json.RawMessage, error) {
	res, err := s.agent.Call(ctx, sock, "guest-"+cmd, args)
	if err != nil {
		var ae *AgentError
		if errors.As(err, &ae) {
			if ae.Desc != "" {
				return nil, fail("Agent error: %s", ae.Desc)
			}
			return nil, fail("Agent error: %s", errmsg)
		}
		return nil, fail("VM %d qmp command 'guest-%s' failed - %v", vmid, cmd, err)
	}
	return res, nil
}

func (s *Server) agentPing(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	sock, err := s.agentAvailable(ctx, vmid)
	if err != nil {
		return nil, err
	}
	res, err := s.monCmd(ctx, vmid, sock, "ping", nil, "")
	if err != nil {
		return nil, err
	}
	return map[string]any{"result": res}, nil
}

func (s *Server) agentExec(ctx context.Context, rq *request) (any, error) {
	if err := s.openVM(rq, nil, vmExists); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	cmd := rq.strings("command")
	args := map[string]any{"capture-output": true}
	errmsg := "can't execute command"
	if len(cmd) > 0 {
		args["path"] = cmd[0]
		args["arg"] = append([]string{}, cmd[1:]...)
		errmsg += fmt.Sprintf(" (%s %v)", cmd[0], cmd[1:])
	}
	if rq.has("input-data") {
		args["input-data"] = base64.StdEncoding.EncodeToString([]byte(rq.str("input-data")))
		errmsg += " (input-data given)"
	}
	if len(cmd) == 0 && !rq.has("input-data") {
		return nil, fail("command or input-data (or both) required")
	}
	res, err := s.agentCmd(ctx, vmid, "exec", args, errmsg)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(res, &out); err != nil {
		return nil, fail("Agent error: %s", errmsg)
	}
	return out, nil
}

func (s *Server) agentExecStatus(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, pid := s.vmid(rq), rq.int("pid", 0)
	res, err := s.agentCmd(ctx, vmid, "exec-status", map[string]any{"pid": pid}, fmt.Sprintf("can't get exec status for '%d'", pid))
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(res, &out); err != nil {
		return nil, fail("Agent error: can't get exec status for '%d'", pid)
	}
	// qemu_exec_status decodes the data to a Perl byte string: each byte
	// one character in the JSON answer (latin1), in 9.1 and 9.2 alike.
	for _, k := range []string{"out-data", "err-data"} {
		if b64, ok := out[k].(string); ok && b64 != "" {
			if dec, err := base64.StdEncoding.DecodeString(b64); err == nil {
				out[k] = latin1(dec)
			}
		}
	}
	for k, v := range out {
		if b, ok := v.(bool); ok {
			out[k] = boolInt(b)
		}
	}
	return out, nil
}

func (s *Server) agentFileRead(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	if s.release == Release91 {
		errs := ParamErrors{}
		for _, k := range fileReadSince92 {
			if rq.has(k) {
				errs[k] = "property is not defined in schema and the schema does not allow additional properties"
			}
		}
		if len(errs) > 0 {
			return nil, paramFail(errs)
		}
	}
	vmid := s.vmid(rq)
	count := rq.int("count", maxReadSize)
	offset := rq.int("offset", 0)
	decode := rq.bool("decode", true)
	raw, err := s.agentCmd(ctx, vmid, "file-open", map[string]any{"path": rq.str("file")}, "can't open file")
	if err != nil {
		return nil, err
	}
	var handle int64
	if err := json.Unmarshal(raw, &handle); err != nil {
		return nil, fail("Agent error: can't open file")
	}
	sock := s.backendOf(vmid).AgentSocket(vmid)
	if offset > 0 {
		if _, err := s.monCmd(ctx, vmid, sock, "file-seek", map[string]any{"handle": handle, "offset": offset, "whence": "set"}, "can't seek to offset position"); err != nil {
			return nil, err
		}
	}
	var content []byte
	read, eof := 0, false
	for read < count && !eof {
		chunk := min(count-read, 1024*1024)
		raw, err := s.monCmd(ctx, vmid, sock, "file-read", map[string]any{"handle": handle, "count": chunk}, "can't read from file")
		if err != nil {
			return nil, err
		}
		var rep struct {
			Count int    `json:"count"`
			Buf   string `json:"buf-b64"`
			EOF   bool   `json:"eof"`
		}
		if err := json.Unmarshal(raw, &rep); err != nil {
			return nil, fail("Agent error: can't read from file")
		}
		if decode {
			b, err := base64.StdEncoding.DecodeString(rep.Buf)
			if err != nil {
				return nil, fail("Agent error: can't read from file")
			}
			content = append(content, b...)
		} else {
			content = append(content, rep.Buf...)
		}
		read += rep.Count
		eof = rep.EOF
		if rep.Count == 0 && !rep.EOF {
			break
		}
	}
	_, _ = s.monCmd(ctx, vmid, sock, "file-close", map[string]any{"handle": handle}, "can't close file")
	// decode=1: the decoded bytes as a Perl byte string (latin1); decode=0:
	// each chunk's own base64, concatenated (padding inside).
	text := string(content)
	if decode {
		text = latin1(content)
	}
	out := map[string]any{"content": text, "bytes-read": read}
	if !eof {
		out["truncated"] = 1
	}
	return out, nil
}

func (s *Server) agentFileWrite(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	buf := rq.str("content")
	if rq.bool("encode", true) {
		buf = base64.StdEncoding.EncodeToString([]byte(buf))
	}
	raw, err := s.agentCmd(ctx, vmid, "file-open", map[string]any{"path": rq.str("file"), "mode": "wb"}, "can't open file")
	if err != nil {
		return nil, err
	}
	var handle int64
	if err := json.Unmarshal(raw, &handle); err != nil {
		return nil, fail("Agent error: can't open file")
	}
	if _, err := s.agentCmd(ctx, vmid, "file-write", map[string]any{"handle": handle, "buf-b64": buf}, "can't write to file"); err != nil {
		return nil, err
	}
	if _, err := s.agentCmd(ctx, vmid, "file-close", map[string]any{"handle": handle}, "can't close file"); err != nil {
		return nil, err
	}
	return nil, nil
}

// agentSimple serves the generic agent endpoints (register_command in
// qemu-server): availability check, the guest-<cmd> call, {"result": ...}.
func (s *Server) agentSimple(cmd string) handlerFunc {
	return func(ctx context.Context, rq *request) (any, error) {
		if err := s.checkNode(rq); err != nil {
			return nil, err
		}
		vmid := s.vmid(rq)
		sock, err := s.agentAvailable(ctx, vmid)
		if err != nil {
			return nil, err
		}
		res, err := s.monCmd(ctx, vmid, sock, cmd, nil, "")
		if err != nil {
			return nil, err
		}
		return map[string]any{"result": res}, nil
	}
}
