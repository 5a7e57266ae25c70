package pveapi

import (
	"encoding/json"
	"os"
	"sort"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// usedPaths are the Proxmox API paths this package calls.
var usedPaths = []string{
	"/cluster/nextid", "/cluster/resources", "/nodes/{node}/qemu/{vmid}/clone", "/nodes/{node}/qemu/{vmid}/config",
	"/nodes/{node}/qemu/{vmid}/resize", "/nodes/{node}/qemu/{vmid}/status/start", "/nodes/{node}/qemu/{vmid}/status/stop",
	"/nodes/{node}/qemu/{vmid}", "/nodes/{node}/qemu/{vmid}/snapshot", "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback",
	"/cluster/sdn/zones", "/cluster/sdn/zones/{zone}", "/cluster/sdn/vnets", "/cluster/sdn/vnets/{vnet}",
	"/cluster/sdn/vnets/{vnet}/subnets", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}", "/cluster/sdn", "/pools",
	"/nodes/{node}/firewall/rules", "/nodes/{node}/firewall/rules/{pos}", "/nodes/{node}/firewall/options",
	"/cluster/firewall/options", "/nodes/{node}/tasks/{upid}/status", "/nodes/{node}/tasks/{upid}/log",
	"/nodes/{node}/qemu", "/nodes/{node}/qemu/{vmid}/status/current", "/cluster/sdn/ipams/{ipam}/status",
	"/cluster/sdn/vnets/{vnet}/ips", "/nodes",
	"/nodes/{node}/lxc", "/nodes/{node}/lxc/{vmid}", "/nodes/{node}/lxc/{vmid}/clone", "/nodes/{node}/lxc/{vmid}/config",
	"/nodes/{node}/lxc/{vmid}/status/current", "/nodes/{node}/lxc/{vmid}/status/start", "/nodes/{node}/lxc/{vmid}/status/stop",
	"/nodes/{node}/lxc/{vmid}/snapshot", "/nodes/{node}/lxc/{vmid}/snapshot/{snapname}/rollback",
	"/nodes/{node}/storage/{storage}/download-url", "/nodes/{node}/storage/{storage}/content", "/storage",
	"/nodes/{node}/qemu/{vmid}/template", "/nodes/{node}/qemu/{vmid}/status/shutdown",
}

// paramSchema is one parameter of the trimmed schema.
type paramSchema struct {
	Type     string   `json:"type,omitempty"`
	Optional bool     `json:"optional,omitempty"`
	Enum     []string `json:"enum,omitempty"`
}

// trimmed maps "METHOD /path" to its parameters.
type trimmed map[string]map[string]paramSchema

func TestSchemaExtract(t *testing.T) {
	if !testkit.Update() {
		t.Skip("run with -update to regenerate testdata/apidata-trimmed.json")
	}
	src := os.Getenv("PVE_APIDATA")
	if src == "" {
		src = "/work/shared/pve-api/apidata.json"
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		Path string `json:"path"`
		Info map[string]struct {
			Parameters struct {
				Properties map[string]struct {
					Type     string   `json:"type"`
					Optional any      `json:"optional"`
					Enum     []string `json:"enum"`
				} `json:"properties"`
			} `json:"parameters"`
		} `json:"info"`
		Children []json.RawMessage `json:"children"`
	}
	out := trimmed{}
	want := map[string]bool{}
	for _, p := range usedPaths {
		want[p] = true
	}
	var walk func(raw json.RawMessage)
	walk = func(raw json.RawMessage) {
		var n node
		if err := json.Unmarshal(raw, &n); err != nil {
			t.Fatal(err)
		}
		if want[n.Path] {
			for m, info := range n.Info {
				ps := map[string]paramSchema{}
				for name, p := range info.Parameters.Properties {
					opt := p.Optional == float64(1) || p.Optional == true
					ps[name] = paramSchema{Type: p.Type, Optional: opt, Enum: p.Enum}
				}
				out[m+" "+n.Path] = ps
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	var roots []json.RawMessage
	if err := json.Unmarshal(b, &roots); err != nil {
		t.Fatal(err)
	}
	for _, r := range roots {
		walk(r)
	}
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	enc, _ := json.MarshalIndent(out, "", " ")
	if err := os.WriteFile("testdata/apidata-trimmed.json", append(enc, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d operations", len(keys))
}
