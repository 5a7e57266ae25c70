package doctor

import (
	"context"
	"strings"
)

// StagedNetwork reads the node's staged host network edits
// (pveapi.Client.StagedNetworkChanges).
type StagedNetwork interface {
	StagedNetworkChanges(ctx context.Context) (string, error)
}

// NetworkCheck wants no staged host network edits on the node: every SDN
// apply reloads every node's network, and a reload first renames a staged
// /etc/network/interfaces.new over /etc/network/interfaces (pve-manager
// API2/Network.pm reload_network_config), so the daemon's next create
// would put someone's unfinished edit of the host network live.
func NetworkCheck(px StagedNetwork, n Node) Check {
	return Check{Name: "staged host network edits", Run: func(ctx context.Context) Outcome {
		diff, err := px.StagedNetworkChanges(ctx)
		if err != nil {
			return failf("GET /nodes/"+n.Name+"/network is open to every user; check [api.proxmox] url and that the node is up", "GET /nodes/%s/network: %v", n.Name, err)
		}
		if strings.TrimSpace(diff) == "" {
			return passf("none staged in /etc/network/interfaces.new")
		}
		return failf("review them, then apply (node > System > Network > Apply Configuration, or pvesh set /nodes/"+n.Name+"/network) or revert them (pvesh delete /nodes/"+n.Name+"/network): the daemon's next SDN apply would apply them",
			"staged edits of the host network would go live with the daemon's next SDN apply:\n%s", firstLines(diff, 12))
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
