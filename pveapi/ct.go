package pveapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// Containers (pve-container) by the daemon's token. Their calls differ
// from the VMs' where pve-container differs from qemu-server:
//   - the config update is PUT .../lxc/{vmid}/config and synchronous (no
//     async POST: API2/LXC/Config.pm update_vm);
//   - a stop of a CT that does not run fails "CT N not running" in the
//     request (API2/LXC/Status.pm vm_stop; qemu-server's succeeds);
//   - a destroy with force stops a running CT in its own task
//     (API2/LXC.pm destroy_vm), which always removes the CT's ACLs and
//     pool membership;
//   - a clone takes the template's "lock: disk" and the new id's "lock:
//     create" in the request (API2/LXC.pm clone_vm): a taken id is refused
//     at once ("CT N already exists on node ...").
//
// Proxmox checks a call's privilege on /vms/<vmid> before it loads the
// config, and the token has its privileges through the pool, which a CT
// that does not exist is not in: such a call is refused (403) rather than
// not found. ctGone tells the two apart.

var _ sandbox.Containers = (*Client)(nil)

func (c *Client) lxc(vmid int) string {
	return fmt.Sprintf("/nodes/%s/lxc/%d", url.PathEscape(c.node), vmid)
}

// ctGone makes err, a call's failure on CT vmid, wrap sandbox.ErrNotFound
// when Proxmox refused the call (403) and the token sees no CT of that id
// on this node (in /cluster/resources, which lists only guests it has
// VM.Audit on: a CT outside the pool counts as absent, as in CT).
func (c *Client) ctGone(ctx context.Context, vmid int, err error) error {
	if err == nil || errors.Is(err, sandbox.ErrNotFound) || !errors.Is(err, proxmox.ErrForbidden) {
		return err
	}
	pools, perr := c.pools(ctx, kindLXC)
	if perr != nil {
		return err
	}
	if _, ok := pools[vmid]; ok {
		return err
	}
	return fmt.Errorf("CT %d: %w: %w", vmid, sandbox.ErrNotFound, err)
}

// CTTemplateID implements sandbox.Containers: the node's CT list (GET
// /nodes/{node}/lxc, pve-container API2/LXC.pm vmlist; a CT's name is
// its hostname, LXC.pm vmstatus).
func (c *Client) CTTemplateID(ctx context.Context, name string) (int, error) {
	return c.templateID(ctx, kindLXC, name)
}

// CloneCT implements sandbox.Containers: a linked clone (full=0: a source
// that is no template is refused, "Linked clone feature ... is not
// available", rather than copied) with s.Name as its hostname, into
// s.Pool.
func (c *Client) CloneCT(ctx context.Context, s sandbox.CloneSpec) error {
	body := map[string]any{"newid": s.NewID, "full": 0}
	if s.Name != "" {
		body["hostname"] = s.Name
	}
	if s.Pool != "" {
		body["pool"] = s.Pool
	}
	err := c.call(ctx, "POST", fmt.Sprintf("clone CT %d to %d", s.Template, s.NewID), c.lxc(s.Template)+"/clone", body)
	return c.ctGone(ctx, s.Template, err)
}

// ctConfig reads a CT's config with its pending values taken in.
func (c *Client) ctConfig(ctx context.Context, vmid int) (map[string]any, error) {
	var cfg map[string]any
	if err := c.c.Get(ctx, c.lxc(vmid)+"/config", &cfg); err != nil {
		return nil, c.ctGone(ctx, vmid, classify(fmt.Sprintf("read config of CT %d", vmid), err))
	}
	return cfg, nil
}

// ctNet is a CT NIC's value (pve-container LXC/Config.pm
// parse_lxc_network): veth eth<i> on bridge, DHCP, the firewall off,
// hwaddr when mac is set (else Proxmox picks one).
func ctNet(i int, bridge, mac string) string {
	v := fmt.Sprintf("name=eth%d,bridge=%s", i, bridge)
	if mac != "" {
		v += ",hwaddr=" + mac
	}
	return v + ",ip=dhcp,firewall=0"
}

// ConfigureCT implements sandbox.Containers: one PUT .../config
// (synchronous) with tags, hostname, cores, memory, swap 0 and the NICs;
// the config's other netN (the template's) are deleted in the same
// update. Tags replace the template's; none deletes them.
func (c *Client) ConfigureCT(ctx context.Context, vmid int, v sandbox.CTConfig) error {
	cfg, err := c.ctConfig(ctx, vmid)
	if err != nil {
		return err
	}
	body := map[string]any{"cores": v.Cores, "memory": v.MemoryMiB, "swap": 0}
	var del []string
	if len(v.Tags) > 0 {
		body["tags"] = strings.Join(v.Tags, ";")
	} else if _, ok := cfg["tags"]; ok {
		del = append(del, "tags")
	}
	if v.Hostname != "" {
		body["hostname"] = v.Hostname
	}
	for i, b := range v.Bridges {
		mac := ""
		if i < len(v.MACs) {
			mac = v.MACs[i]
		}
		body[fmt.Sprintf("net%d", i)] = ctNet(i, b, mac)
	}
	del = append(del, extraNets(cfg, len(v.Bridges))...)
	if len(del) > 0 {
		body["delete"] = strings.Join(del, ",")
	}
	err = c.call(ctx, "PUT", fmt.Sprintf("configure CT %d", vmid), c.lxc(vmid)+"/config", body)
	return c.ctGone(ctx, vmid, err)
}

// SetCTTags implements sandbox.Containers: one PUT .../config with tags
// and hostname only (synchronous; both fast-plug options of a running CT,
// pve-container LXC/Config.pm $LXC_FASTPLUG_OPTIONS, written to its config
// at once and nothing else changed: no NIC is touched, so the running
// CT's veths stay as they are).
func (c *Client) SetCTTags(ctx context.Context, vmid int, hostname string, tags []string) error {
	body := map[string]any{"tags": strings.Join(tags, ";"), "hostname": hostname}
	err := c.call(ctx, "PUT", fmt.Sprintf("tag CT %d", vmid), c.lxc(vmid)+"/config", body)
	return c.ctGone(ctx, vmid, err)
}

// StartCT implements sandbox.Containers. Its NICs are mapped in their
// zones' dnsmasq by the CT's pre-start hook (pve-container
// lxc-pve-prestart-hook, pve-network Vnets.pm add_dhcp_mapping), which
// fails while an SDN apply has them stopped, as a VM's pve-bridge hook
// does: such a start is made again as StartVM's.
func (c *Client) StartCT(ctx context.Context, vmid int) error {
	err := c.startGuest(ctx, fmt.Sprintf("start CT %d", vmid), c.lxc(vmid), vmid)
	return c.ctGone(ctx, vmid, err)
}

// StopCT implements sandbox.Containers (a hard stop: lxc-stop --kill).
// pve-container refuses a CT that does not run, in the request, before
// it loads the config ("CT N not running": a CT that does not exist
// does not run either); that is no error here, nor is a CT the token
// finds absent.
func (c *Client) StopCT(ctx context.Context, vmid int) error {
	err := c.call(ctx, "POST", fmt.Sprintf("stop CT %d", vmid), c.lxc(vmid)+"/status/stop", map[string]any{})
	if err != nil && strings.Contains(err.Error(), fmt.Sprintf("CT %d not running", vmid)) {
		return nil
	}
	if err = c.ctGone(ctx, vmid, err); errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return err
}

// DeleteCT implements sandbox.Containers: DELETE with purge (backup and
// replication jobs, HA; the ACLs and pool membership go in any case) and
// force, which has the destroy's own task stop a running CT (a separate
// stop before it could find the CT running again). The config is loaded
// in the request: a CT that does not exist is refused at once.
func (c *Client) DeleteCT(ctx context.Context, vmid int) error {
	err := c.call(ctx, "DELETE", fmt.Sprintf("delete CT %d", vmid), c.lxc(vmid)+"?purge=1&force=1", nil)
	return c.ctGone(ctx, vmid, err)
}

// CT implements sandbox.Containers: status, name (the hostname), tags,
// template and lock from GET .../status/current (live), the pool from
// /cluster/resources, where a VM's id is no CT.
func (c *Client) CT(ctx context.Context, vmid int) (sandbox.VMInfo, error) {
	info, err := c.guest(ctx, kindLXC, vmid, c.lxc(vmid))
	return info, c.ctGone(ctx, vmid, err)
}

// ListCTs implements sandbox.Containers: GET /nodes/{node}/lxc (live),
// pools from /cluster/resources.
func (c *Client) ListCTs(ctx context.Context) ([]sandbox.VMInfo, error) {
	return c.listGuests(ctx, kindLXC)
}

// CTConfigValues implements sandbox.Containers: GET .../config (pending
// values taken in: the config the next start runs, as VMConfig), every
// value as the config file's text (pve-container returns integers and
// booleans as numbers), the digest left out.
func (c *Client) CTConfigValues(ctx context.Context, vmid int) (map[string]string, error) {
	cfg, err := c.ctConfig(ctx, vmid)
	if err != nil {
		return nil, err
	}
	return configTexts(cfg), nil
}

// SnapshotCT implements sandbox.Containers: POST .../snapshot, a vzsnapshot
// task (pve-container API2/LXC/Snapshot.pm snapshot; pve-guest-common
// AbstractConfig.pm snapshot_create: a running CT is frozen around its
// volumes' snapshots). A name taken fails "snapshot name '...' already
// used" (ErrExists); a CT locked by another operation fails "CT is
// locked (...)".
func (c *Client) SnapshotCT(ctx context.Context, vmid int, name string) error {
	err := c.call(ctx, "POST", fmt.Sprintf("snapshot CT %d", vmid), c.lxc(vmid)+"/snapshot", map[string]any{"snapname": name})
	return c.ctGone(ctx, vmid, err)
}

// RollbackCT implements sandbox.Containers: POST .../rollback, a
// vzrollback task (Snapshot.pm rollback, AbstractConfig.pm
// snapshot_rollback: a running CT is stopped first), then StartCT. The
// rollback's own start=1 is not used: Snapshot.pm calls the start
// handler as a method from the rollback's worker, which forks a vzstart
// task of its own and returns, so the rollback's task ends before the CT
// runs and a failed start is in no task this client waits for.
func (c *Client) RollbackCT(ctx context.Context, vmid int, name string) error {
	err := c.call(ctx, "POST", fmt.Sprintf("rollback CT %d to %s", vmid, name), c.lxc(vmid)+"/snapshot/"+url.PathEscape(name)+"/rollback", map[string]any{})
	if err = c.ctGone(ctx, vmid, err); err != nil {
		return err
	}
	return c.StartCT(ctx, vmid)
}
