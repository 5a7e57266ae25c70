package mcpserver_test

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// FuzzToolArguments sends arbitrary JSON arguments (an agent's input) to
// every tool: each call ends in a result (success with structured content
// or a tool error with a message), never a protocol failure or a crash.
func FuzzToolArguments(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"id":"ID","argv":["echo","x"]}`, `{"id":"ID","command":"ls"}`, `{"id":"ID","path":"/etc/motd"}`,
		`{"id":"ID","path":"/x","content":"AAEC","encoding":"base64","mode":"0755"}`, `{"size":"small","lifetime_hours":24}`,
		`{"id":"ID","lifetime_hours":1e9}`, `{"id":"ID","max_bytes":-5}`, `{"id":["x"]}`, `null`, `[]`, `"s"`,
		`{"id":"ID","name":"../../x"}`, `{"labels":{"a":"b"},"template":"debian"}`,
	} {
		for tool := range 11 {
			f.Add(uint8(tool), s)
		}
	}
	f.Fuzz(func(t *testing.T, tool uint8, args string) {
		b := fuzzBed(t)
		names := []string{mcpserver.ToolCreate, mcpserver.ToolList, mcpserver.ToolGet, mcpserver.ToolExec, mcpserver.ToolReadFile,
			mcpserver.ToolWriteFile, mcpserver.ToolExtend, mcpserver.ToolDestroy, mcpserver.ToolSnapshot, mcpserver.ToolRollback, mcpserver.ToolCheck}
		name := names[int(tool)%len(names)]
		if !json.Valid([]byte(args)) {
			return
		}
		res, err := b.sess.CallTool(b.ctx(), &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)})
		if err != nil {
			// The SDK refuses arguments that are not an object at the
			// protocol level; everything else must be a result.
			var v any
			_ = json.Unmarshal([]byte(args), &v)
			if _, isObj := v.(map[string]any); isObj {
				t.Fatalf("%s %s: protocol error %v", name, args, err)
			}
			return
		}
		if res.IsError && text(res) == "" {
			t.Fatalf("%s %s: tool error without a message", name, args)
		}
		if !res.IsError && res.StructuredContent == nil {
			t.Fatalf("%s %s: success without structured content", name, args)
		}
	})
}

// fuzzBed is a fresh bed per input (fakes are cheap), so inputs do not
// depend on each other.
func fuzzBed(t *testing.T) *bed {
	return newBed(t, bedOpts{})
}
