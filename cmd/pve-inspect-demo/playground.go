package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

const (
	// apiPort is the playground daemon's TCP listener on the node's
	// management address.
	apiPort = 8443
	// playgroundKey is the stand-in secret of the playground's [mcp]
	// env_file: every sandbox created through MCP over stdio, or over HTTP
	// with a token of playgroundOwner, gets it in /etc/pve-inspect/env.
	playgroundKey = "playground-not-a-real-key"
	// playgroundOwner is the owner the example tokens are bound to: they
	// see and touch only its sandboxes, and create sandboxes for it.
	playgroundOwner = "playground"
)

// playgroundToken is one token the playground creates and prints.
type playgroundToken struct {
	key, name, scope, owner string // key: the printed "key = token" line
}

// playgroundTokens are the printed tokens: the examples use token (admin
// scope, bound to playgroundOwner) and read_token (bound to it too);
// admin_token is bound to no owner (it sees and deletes every owner's
// sandboxes) and is printed for node-wide operations only.
var playgroundTokens = []playgroundToken{
	{"token", "playground", "admin", playgroundOwner},
	{"read_token", "playground-read", "read", playgroundOwner},
	{"admin_token", "playground-admin", "admin", ""},
}

// playground brings the node in a box up with the emulator, the daemon, its
// API socket, a TLS listener with the printed tokens and the MCP server,
// prints how to reach each, and tears everything down when ctx ends
// (Ctrl-C, SIGTERM). listen is the loopback address forwarded to the
// node's API listener, so clients outside the bed's namespaces reach it.
func playground(ctx context.Context, o options, w io.Writer) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the playground builds network namespaces and nftables tables: run it as root (sudo make playground)")
	}
	inspectd := filepath.Join(o.binDir, "pve-inspectd")
	probePath := filepath.Join(o.binDir, "pve-inspect-probe")
	for _, p := range []string{inspectd, probePath} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %w (run `make build` first)", p, err)
		}
	}
	// The mirror of the built-ins the node builds on request, served by
	// the bed's uplink (the "internet").
	images, err := os.MkdirTemp("", "pvei-mirror-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(images)
	if err := writeMirror(images, mirrorRecipes); err != nil {
		return err
	}
	bed, err := testvm.Up(ctx, testvm.Options{NodePorts: []int{22, 3128}, ImagesDir: images})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := bed.Close(); cerr != nil {
			fmt.Fprintln(w, "teardown:", cerr)
			err = errors.Join(err, cerr)
			return
		}
		fmt.Fprintln(w, "playground down: every namespace, link, mount and process of the bed is gone")
	}()
	release, err := pveemu.ParseRelease(o.release)
	if err != nil {
		return err
	}
	rootPassword := hex.EncodeToString(randomBytes(12))
	ctRootfs, err := testvm.CTRootfs(ctx)
	if err != nil {
		return err
	}
	emu, caFile, tokenID, secretFile, err := startEmulator(ctx, bed, pveemu.Options{Release: release, RootPassword: rootPassword,
		Backend: buildBackend{pveemu.BedBackend{Bed: bed}}}, ctRootfs)
	if err != nil {
		return err
	}
	defer emu.Close()
	// Builds download to local's import directory, write their snippets
	// there and extract an OVA's disk on it (images; the disk transfer's
	// images are listed by that type too).
	emu.SetStorageContent("local", "backup,images,import,iso,snippets,vztmpl")
	dir := filepath.Join(bed.Dir(), "demo")
	var pluginLines string
	if o.referencePlugin {
		if pluginLines, err = readyForReferencePlugin(ctx, emu, bed, dir, rootPassword); err != nil {
			return err
		}
	}
	apiCA, apiCert, apiKey, err := writeAPICert(dir)
	if err != nil {
		return err
	}
	apiAddr := net.JoinHostPort(testvm.NodeMgmtAddr, fmt.Sprint(apiPort))
	// the bed's containers: its lxc path, and their cgroups where the
	// daemon (started by ip netns exec, which hides /sys/fs/cgroup)
	// sees them
	ctCgroups, err := bed.ContainerCgroupsOutsideSys(ctx)
	if err != nil {
		return err
	}
	// allow_e1000: the reference's CTF victims (old VulnHub OVAs without
	// virtio drivers) ask for an e1000 NIC; a bed guest is a network
	// namespace, with no emulated NIC whose device code it could drive.
	extra := fmt.Sprintf("listen = %q\ntls_cert = %q\ntls_key = %q\ncontainers = true\nlxc_path = %q\ncontainer_cgroups = %q\nallow_e1000 = true\n",
		apiAddr, apiCert, apiKey, bed.LXCPath(), ctCgroups)
	if o.diskStorage != "" {
		// The disk path, as an operator turns it on: files of 32 MiB and
		// more go through a transfer disk on that storage.
		// (local has the images content type, set above, so that its
		// transfer images are listed: pve-storage lists only the
		// configured types, and a leaked one shows).
		extra += fmt.Sprintf("disk_transfer_storage = %q\n", o.diskStorage)
	}
	// A stand-in model API key, to show where an agent's keys land.
	envFile := filepath.Join(dir, "mcp.env")
	if err := os.WriteFile(envFile, []byte("PLAYGROUND_API_KEY="+playgroundKey+"\n"), 0o600); err != nil {
		return err
	}
	mcpExtra := fmt.Sprintf("env_file = %q\nenv_file_owners = [%q]\n", envFile, playgroundOwner)
	// [templates] follows [mcp], the last section writeConfig writes.
	templates, err := templatesSection(dir, rootPassword)
	if err != nil {
		return err
	}
	mcpExtra += templates
	cfgPath, sock, _, err := writeConfig(dir, bed, probePath, caFile, tokenID, secretFile, extra, mcpExtra)
	if err != nil {
		return err
	}
	stopDaemon, err := startDaemon(ctx, io.Discard, bed, inspectd, cfgPath, sock)
	if err != nil {
		return err
	}
	defer func() {
		if stopDaemon != nil {
			stopDaemon()
		}
	}()
	tokens := map[string]string{}
	for _, pt := range playgroundTokens {
		argv := []string{inspectd, "-c", cfgPath, "token", "create", pt.name, "--scope", pt.scope}
		if pt.owner != "" {
			argv = append(argv, "--owner", pt.owner)
		}
		out, err := bed.Command(ctx, bed.NodeNS(), argv...).Output()
		if err != nil {
			return fmt.Errorf("token create %s: %w", pt.name, err)
		}
		tokens[pt.key] = strings.TrimSpace(string(out))
	}
	fwd, err := forward(bed, o.listen, apiAddr)
	if err != nil {
		return err
	}
	defer fwd.Close()
	fmt.Fprint(w, pluginLines)
	printEndpoints(w, bed, inspectd, cfgPath, sock, "https://"+fwd.Addr().String(), apiCA, envFile, tokens, buildRecipes(o.referencePlugin))
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(w, "stopping: daemon, emulator, bed")
			return nil
		case <-o.restart:
			// SIGHUP: the daemon stops (SIGTERM, as systemd stops the
			// unit) and starts again on the same configuration and
			// state, the sandboxes staying up, as `systemctl restart
			// pve-inspectd` does on a node.
			stopDaemon()
			stopDaemon = nil
			if stopDaemon, err = startDaemon(ctx, io.Discard, bed, inspectd, cfgPath, sock); err != nil {
				return fmt.Errorf("restart pve-inspectd: %w", err)
			}
			fmt.Fprintln(w, "pve-inspectd restarted")
		}
	}
}

// builtinTemplateID is the playground's stand-in for the reference
// plugin's built-in template.
const builtinTemplateID = 9001

// readyForReferencePlugin readies the node as the reference plugin's suite
// expects one (its README and src/proxmoxsandbox/scripts/ec2/userdata.sh):
// the dir storage "local" with content iso,vztmpl,backup,snippets,images,
// rootdir,import, and a template it finds as its built-in "ubuntu24.04"
// (tags "inspect" and "builtin-ubuntu24.04", _impl/built_in_vm.py
// known_builtins) - the bed's Debian guest standing in for Ubuntu. It
// writes root@pam's password to a file and returns the "key = value" lines
// scripts/reference-suite.sh reads.
func readyForReferencePlugin(ctx context.Context, emu *pveemu.Server, bed *testvm.Bed, dir, rootPassword string) (string, error) {
	emu.SetStorageContent("local", "iso,vztmpl,backup,snippets,images,rootdir,import")
	if err := emu.AddTemplate(ctx, builtinTemplateID, "ubuntu24.04", filepath.Join(bed.Dir(), "template-disk"),
		map[string]string{"net0": pveemu.SandboxNet0, "tags": "builtin-ubuntu24.04;inspect"}); err != nil {
		return "", err
	}
	pwFile := filepath.Join(dir, "pve-root-password")
	if err := os.WriteFile(pwFile, []byte(rootPassword+"\n"), 0o600); err != nil {
		return "", err
	}
	return fmt.Sprintf("uplink_ns = %s\npve_host = %s\npve_root_password_file = %s\nmarker = %s\n",
		bed.UplinkNS(), testvm.NodeMgmtAddr, pwFile, filepath.Join(dir, "inspect-proxmox-egress-lockdown")), nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// printEndpoints says how to reach every part. The "key = value" lines are
// what playground_test.go reads.
func printEndpoints(w io.Writer, bed *testvm.Bed, inspectd, cfgPath, sock, url, ca, envFile string, tokens map[string]string, builds []string) {
	stdio := []string{"ip", "netns", "exec", bed.NodeNS(), inspectd, "-c", cfgPath, "mcp"}
	stdioJSON, _ := json.Marshal(stdio)
	claudeStdio, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"pve-inspect": map[string]any{"command": "sudo", "args": stdio}}})
	claudeHTTP, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"pve-inspect": map[string]any{"type": "http", "url": url + "/v1/mcp",
		"headers": map[string]string{"Authorization": "Bearer " + tokens["token"]}}}})
	fmt.Fprintf(w, `
pve-inspect playground: a Proxmox node in a box with pve-inspectd, the
emulated Proxmox API and real qemu-ga guests. Ctrl-C or SIGTERM tears it down;
SIGHUP restarts pve-inspectd (its sandboxes stay), as systemctl restart does.

bed = %s
config = %s
socket = %s
api = %s
ca = %s
owner = %s
token = %s
read_token = %s
admin_token = %s
mcp_url = %s/v1/mcp
mcp_stdio = %s
env_file = %s
builds = %s
mirror = %s

token (admin scope) and read_token are bound to owner %s: they see and
touch only its sandboxes; the examples use them. admin_token is bound to
no owner: it sees and deletes every owner's sandboxes (node-wide
operations only, e.g. PVE_INSPECT_CLEANUP_ALL=1 inspect sandbox cleanup).

Template builds are on ([templates] build, from the mirror on the bed's
uplink): the built-ins %s are built on request, the first time a
task asks for one (VmSourceConfig(built_in=...)) or with admin_token:
  curl --cacert %s -H 'Authorization: Bearer ADMIN_TOKEN' -H 'Content-Type: application/json' \
       -d '{"name":"%s","recipe":"%s"}' %s/v1/templates/build

CLI (as root):
  %s -c %s sandbox create --template debian
  %s -c %s sandbox list
curl:
  curl --cacert %s -H 'Authorization: Bearer %s' %s/v1/sandboxes
  curl --cacert %s -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' \
       -d '{"vms":[{"template":"debian"}]}' %s/v1/sandboxes
Inspect (the pve_inspect provider; python/install.sh first):
  export PVE_INSPECT_URL=%s PVE_INSPECT_TOKEN=%s PVE_INSPECT_CA_FILE=%s
  python/.venv/bin/inspect eval python/examples/two_vm_task.py
MCP, stdio (Claude Code: claude mcp add pve-inspect -- sudo %s):
  %s
MCP, streamable HTTP (set NODE_EXTRA_CA_CERTS=%s for Node clients):
  %s
Sandboxes created through MCP over stdio, or over HTTP with a token of
owner %s ([mcp] env_file_owners), get the variables of env_file in
/etc/pve-inspect/env (mode 0600, root only); admin_token's do not.
playground ready
`, bed.Name(), cfgPath, sock, url, ca, playgroundOwner, tokens["token"], tokens["read_token"], tokens["admin_token"], url, stdioJSON, envFile,
		strings.Join(builds, ","), mirrorBase(),
		playgroundOwner,
		strings.Join(builds, ", "), ca, builds[0], builds[0], url,
		inspectd, cfgPath, inspectd, cfgPath,
		ca, tokens["read_token"], url, ca, tokens["token"], url,
		url, tokens["token"], ca,
		strings.Join(stdio, " "), claudeStdio, ca, claudeHTTP, playgroundOwner)
}

// writeAPICert writes a self-signed certificate for the API listener (the
// node's pve-ssl.pem stand-in) valid for the management address and
// loopback; the certificate is its own CA.
func writeAPICert(dir string) (ca, cert, key string, err error) {
	c, _, err := pveemu.SelfSignedCert("127.0.0.1", "localhost", testvm.NodeMgmtAddr)
	if err != nil {
		return "", "", "", err
	}
	k, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return "", "", "", errors.New("api certificate: unexpected key type")
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", "", err
	}
	cert, key = filepath.Join(dir, "api.pem"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o644); err != nil {
		return "", "", "", err
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", "", err
	}
	return cert, cert, key, nil
}

// forwarder relays TCP connections from a loopback address of this
// namespace to an address inside the node's namespace.
type forwarder struct {
	ln    net.Listener
	bed   *testvm.Bed
	to    string
	wg    sync.WaitGroup
	mu    sync.Mutex // guards conns
	conns map[net.Conn]bool
}

// forward starts a forwarder on listen (a loopback address) to to.
func forward(bed *testvm.Bed, listen, to string) (*forwarder, error) {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("--listen %q: want a loopback address", listen)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, bed: bed, to: to, conns: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Addr is the loopback address clients dial.
func (f *forwarder) Addr() net.Addr { return f.ln.Addr() }

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() { defer f.wg.Done(); f.relay(c) }()
	}
}

func (f *forwarder) track(c net.Conn, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.conns[c] = true
	} else {
		delete(f.conns, c)
	}
}

func (f *forwarder) relay(c net.Conn) {
	defer c.Close()
	var up net.Conn
	err := f.bed.Do(f.bed.NodeNS(), func() error {
		var err error
		up, err = net.DialTimeout("tcp", f.to, 10*time.Second)
		return err
	})
	if err != nil {
		return
	}
	defer up.Close()
	f.track(c, true)
	f.track(up, true)
	defer f.track(c, false)
	defer f.track(up, false)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// Close stops accepting, closes every relayed connection and waits for
// the relays to end.
func (f *forwarder) Close() error {
	err := f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}
