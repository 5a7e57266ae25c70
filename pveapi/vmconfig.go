package pveapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/luthermonson/go-proxmox"
)

// NewWithPassword returns a Client that logs in with a user's password
// (a ticket) instead of an API token: for `pve-inspectd template harden`,
// the one operation that needs root@pam (qemu-server reserves args,
// hostpci and the like to the user root@pam, not to its API tokens).
func NewWithPassword(o Options, user, password string) (*Client, error) {
	if o.URL == "" || o.Node == "" {
		return nil, errors.New("pve: URL and Node are required")
	}
	name, realm, ok := strings.Cut(user, "@")
	if !ok || name == "" || realm == "" || strings.Contains(user, "!") || password == "" {
		return nil, fmt.Errorf("pve: user %q: want user@realm with a password", user)
	}
	return newClient(o, proxmox.WithCredentials(&proxmox.Credentials{Username: user, Password: password}))
}

// VMConfig returns a VM's configuration as its next start runs it (GET
// .../config without current: pending values merged in; for the stopped
// templates and fresh clones it reads, the same as the current values)
// with every value as the text Proxmox keeps in the config file (numbers rendered without
// exponent; the digest is left out).
func (c *Client) VMConfig(ctx context.Context, vmid int) (map[string]string, error) {
	cfg, err := c.config(ctx, vmid)
	if err != nil {
		return nil, err
	}
	return configTexts(cfg), nil
}

// configText renders a config value as the text of the config file.
func configText(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64)
	case bool:
		return map[bool]string{true: "1", false: "0"}[t]
	default:
		return fmt.Sprint(t)
	}
}

// UpdateVMConfig sets and deletes config keys of a VM in one request.
func (c *Client) UpdateVMConfig(ctx context.Context, vmid int, set map[string]string, del []string) error {
	if len(set) == 0 && len(del) == 0 {
		return nil
	}
	body := map[string]any{}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		body[k] = set[k]
	}
	if len(del) > 0 {
		body["delete"] = strings.Join(del, ",")
	}
	return c.call(ctx, "POST", fmt.Sprintf("update config of %d", vmid), c.qemu(vmid)+"/config", body)
}

// SetVMTags implements sandbox.Proxmox: the VM's tags and name in one
// synchronous config update (PUT, no task to wait for; both are options
// qemu-server applies at once to a running VM, $fast_plug_option in
// PVE/QemuServer.pm; nothing else of the config is sent, so the NICs keep
// their MACs).
func (c *Client) SetVMTags(ctx context.Context, vmid int, name string, tags []string) error {
	body := map[string]any{"tags": strings.Join(tags, ";"), "name": name}
	return c.call(ctx, "PUT", fmt.Sprintf("tag %d", vmid), c.qemu(vmid)+"/config", body)
}
