package doctor

import (
	"context"
	"fmt"
	"strings"
)

// StagedNetwork lists the cluster's nodes (API's Get) and reads a node's
// staged host network edits (pveapi.Client.StagedNetworkChanges).
type StagedNetwork interface {
	API
	StagedNetworkChanges(ctx context.Context, node string) (string, error)
}

// NetworkCheck wants no staged host network edits on any node of the
// cluster: every SDN apply reloads every node's network, and a reload
// first renames a staged /etc/network/interfaces.new over
// /etc/network/interfaces (pve-network SDN.pm reloadnetworkall, pve-manager
// API2/Network.pm reload_network_config), so the daemon's next create
// would put someone's unfinished edit of a host's network live. A node
// that is down is named, not failed on.
func NetworkCheck(px StagedNetwork, n Node) Check {
	return Check{Name: "staged host network edits", Run: func(ctx context.Context) Outcome {
		var nodes []struct {
			Node   string `json:"node"`
			Status string `json:"status"`
		}
		if err := px.Get(ctx, "/nodes", &nodes); err != nil {
			return failf("GET /nodes is open to every user; check [api.proxmox] url", "GET /nodes: %v", err)
		}
		if len(nodes) == 0 {
			nodes = append(nodes, struct {
				Node   string `json:"node"`
				Status string `json:"status"`
			}{Node: n.Name, Status: "online"})
		}
		var staged, down []string
		for _, nd := range nodes {
			if nd.Status != "online" {
				down = append(down, nd.Node)
				continue
			}
			diff, err := px.StagedNetworkChanges(ctx, nd.Node)
			if err != nil {
				return failf("GET /nodes/"+nd.Node+"/network is open to every user; check that the node is up", "GET /nodes/%s/network: %v", nd.Node, err)
			}
			if strings.TrimSpace(diff) != "" {
				staged = append(staged, nd.Node+":\n"+firstLines(diff, 12))
			}
		}
		if len(staged) > 0 {
			return failf("review them, then apply (node > System > Network > Apply Configuration, or pvesh set /nodes/<node>/network) or revert them (pvesh delete /nodes/<node>/network): the daemon's next SDN apply would apply them on every node",
				"staged edits of a host network would go live with the daemon's next SDN apply:\n%s", strings.Join(staged, "\n"))
		}
		msg := fmt.Sprintf("none staged on %d node(s)", len(nodes)-len(down))
		if len(down) > 0 {
			msg += "; not read (node down): " + strings.Join(down, ", ")
		}
		return passf("%s", msg)
	}}
}

// firstLines is s cut to its first n lines.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}
