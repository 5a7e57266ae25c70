package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/containment"
	"github.com/pve-inspect/pve-inspect/internal/deathsig"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

const (
	metricsPort = 9474
	templateID  = 9000
	// ctTemplateID and ctTemplate are the playground's container
	// template (a CT template on the bed's Debian root).
	ctTemplateID = 9100
	ctTemplate   = "ct-debian"
)

// step prints a numbered heading.
type stepper struct {
	w io.Writer
	n int
}

func (s *stepper) step(format string, a ...any) {
	s.n++
	fmt.Fprintf(s.w, "\n== %d. %s\n", s.n, fmt.Sprintf(format, a...))
}

func run(ctx context.Context, o options, w io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("the demo builds network namespaces and nftables tables: run it as root (sudo make demo)")
	}
	inspectd := filepath.Join(o.binDir, "pve-inspectd")
	probePath := filepath.Join(o.binDir, "pve-inspect-probe")
	for _, p := range []string{inspectd, probePath} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %w (run `make build` first)", p, err)
		}
	}
	s := &stepper{w: w}

	s.step("bring up the node in a box (node, uplink with metadata/internet/LAN hosts)")
	bed, err := testvm.Up(ctx, testvm.Options{NodePorts: []int{22, 3128}})
	if err != nil {
		return err
	}
	defer func() {
		s.step("tear down the node in a box")
		if err := bed.Close(); err != nil {
			fmt.Fprintln(w, "teardown:", err)
		} else {
			fmt.Fprintln(w, "every namespace, link, mount and process of the bed is gone")
		}
	}()
	fmt.Fprintf(w, "bed %s: node namespace %s, management %s (%s)\n", bed.Name(), bed.NodeNS(), testvm.NodeMgmtIface, testvm.NodeMgmtAddr)

	// Before anything guards the node, a plain guest sees every leak.
	s.step("no guard yet: the containment probe from a guest sees the leaks")
	if err := leakCheck(ctx, w, bed, probePath); err != nil {
		return err
	}

	s.step("start the Proxmox API emulator on the node (:8006, real qemu-ga guests on start)")
	emu, caFile, tokenID, secretFile, err := startEmulator(ctx, bed, pveemu.Options{}, "")
	if err != nil {
		return err
	}
	defer emu.Close()
	fmt.Fprintf(w, "emulator up; daemon token %s limited to pool pve-inspect, SDN and the template\n", tokenID)

	s.step("start pve-inspectd in the node: host guard, lockdown controller, sandbox API, metrics")
	dir := filepath.Join(bed.Dir(), "demo")
	cfgPath, sock, marker, err := writeConfig(dir, bed, probePath, caFile, tokenID, secretFile, "", "")
	if err != nil {
		return err
	}
	stopDaemon, err := startDaemon(ctx, w, bed, inspectd, cfgPath, sock)
	if err != nil {
		return err
	}
	defer stopDaemon()
	if out, err := bed.Command(ctx, bed.NodeNS(), inspectd, "-c", cfgPath, "status").CombinedOutput(); err != nil {
		return fmt.Errorf("pve-inspectd status: %w\n%s", err, out)
	}
	fmt.Fprintln(w, "pve-inspectd status: the guard is in force (exit 0)")

	c := client.NewUnix(sock)
	s.step("create a sandbox of two VMs through the sandbox API")
	t0 := time.Now()
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian"}},
		Labels: map[string]string{"demo": "yes"}, TTLSeconds: 1800})
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	fmt.Fprintf(w, "sandbox %s ready in %v: zone %s, network %s (%s), VMs", sb.ID, time.Since(t0).Round(time.Millisecond), sb.Zone, sb.Networks[0].Name, sb.Networks[0].CIDR)
	for _, v := range sb.VMs {
		fmt.Fprintf(w, " %s=%d", v.Name, v.VMID)
	}
	fmt.Fprintln(w)
	deleted := false
	defer func() {
		if !deleted {
			_ = c.Delete(context.WithoutCancel(ctx), sb.ID)
		}
	}()

	s.step("exec and a file round trip in vm0 (guest agent, no Proxmox API in the data path)")
	res, err := c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"uname", "-a"}})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	fmt.Fprintf(w, "uname -a -> exit %d: %s", res.ExitCode, res.Stdout)
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	t0 = time.Now()
	if err := c.WriteFile(ctx, sb.ID, "vm0", "/root/demo.bin", bytes.NewReader(data), int64(len(data)), 0o600); err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, sb.ID, "vm0", "/root/demo.bin", &back); err != nil {
		return fmt.Errorf("read file: %w", err)
	}
	if sha256.Sum256(back.Bytes()) != sha256.Sum256(data) {
		return errors.New("file round trip: content differs")
	}
	fmt.Fprintf(w, "8 MiB written and read back in %v, sha256 equal\n", time.Since(t0).Round(time.Millisecond))

	s.step("one MCP round trip: an agent's view through pve-inspectd mcp (stdio, the API socket)")
	if err := mcpRoundTrip(ctx, w, bed, inspectd, cfgPath, sb.ID); err != nil {
		return err
	}

	s.step("containment check from vm0 (guard in force, lockdown off)")
	if err := check(ctx, w, bed, inspectd, cfgPath, sb.ID); err != nil {
		return err
	}

	s.step("egress lockdown on (pve-inspectd lockdown on), then the check again")
	if out, err := bed.Command(ctx, bed.NodeNS(), inspectd, "-c", cfgPath, "lockdown", "on", "--wait", "30s").CombinedOutput(); err != nil {
		return fmt.Errorf("lockdown on: %w\n%s", err, out)
	}
	if out, err := bed.Command(ctx, bed.NodeNS(), inspectd, "-c", cfgPath, "lockdown", "status").CombinedOutput(); err == nil {
		fmt.Fprintf(w, "%s", out)
	}
	if err := check(ctx, w, bed, inspectd, cfgPath, sb.ID); err != nil {
		return err
	}
	if out, err := bed.Command(ctx, bed.NodeNS(), inspectd, "-c", cfgPath, "lockdown", "off", "--wait", "30s").CombinedOutput(); err != nil {
		return fmt.Errorf("lockdown off: %w\n%s", err, out)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("marker %s still there after lockdown off", marker)
	}
	fmt.Fprintln(w, "lockdown off again; the resolver file is restored")

	s.step("delete the sandbox")
	if err := c.Delete(ctx, sb.ID); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	deleted = true
	left := 0
	for _, v := range sb.VMs {
		if _, ok := bed.Guest(v.VMID); ok {
			left++
		}
	}
	fmt.Fprintf(w, "sandbox %s deleted: %d guests left on the node, schema violations in the daemon's Proxmox calls: %d\n", sb.ID, left, len(emu.Violations()))
	if left != 0 || len(emu.Violations()) != 0 {
		return errors.New("the sandbox left something behind or a Proxmox request broke the schema")
	}
	return nil
}

// leakCheck starts a plain guest in a zone of its own and runs the
// containment check with the guard's expectations: every leak shows as
// a FAIL row, so the bed can see what the guard must stop.
func leakCheck(ctx context.Context, w io.Writer, bed *testvm.Bed, probePath string) error {
	vnet := testvm.VNet{Name: "leak0", Subnet: netip.MustParsePrefix("10.99.1.0/24"), Gateway: netip.MustParseAddr("10.99.1.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.99.1.100"), End: netip.MustParseAddr("10.99.1.200")}}, SNAT: true}
	other := testvm.VNet{Name: "leak1", Subnet: netip.MustParsePrefix("10.99.2.0/24"), Gateway: netip.MustParseAddr("10.99.2.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.99.2.100"), End: netip.MustParseAddr("10.99.2.200")}}, SNAT: true}
	for _, z := range []testvm.Zone{{ID: "leaka", VNets: []testvm.VNet{vnet}}, {ID: "leakb", VNets: []testvm.VNet{other}}} {
		if err := bed.AddZone(ctx, z); err != nil {
			return err
		}
	}
	ga, err := bed.StartGuest(ctx, testvm.GuestSpec{VMID: 801, VNet: "leak0"})
	if err != nil {
		return err
	}
	gb, err := bed.StartGuest(ctx, testvm.GuestSpec{VMID: 802, VNet: "leak1"})
	if err != nil {
		return err
	}
	gw6 := testvm.ULAPrefix(vnet).Addr().As16()
	gw6[15] = 1
	var r [4]byte
	_, _ = rand.Read(r[:])
	spec := containment.Spec{
		Gateway: vnet.Gateway, Subnet: vnet.Subnet, Gateway6: netip.AddrFrom16(gw6),
		HostAddrs:    []netip.Addr{netip.MustParseAddr(testvm.NodeMgmtAddr), netip.MustParseAddr(testvm.NodeMgmtAddr6), other.Gateway},
		ControlPorts: append(containment.DefaultControlPorts(), containment.Port{Port: metricsPort, Name: "metrics"}),
		OtherZone:    []netip.AddrPort{netip.AddrPortFrom(gb.IPv4(), 22)},
		LAN:          []netip.AddrPort{netip.MustParseAddrPort(testvm.LANAddr + ":80")},
		Public:       []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)},
		Public6:      []netip.Addr{netip.MustParseAddr(testvm.InternetAddr6)},
		ExternalName: fmt.Sprintf("x%x.%s", r, testvm.InternetName),
		LocalName:    testvm.LocalName("leaka"),
	}
	// The node's port 8006 belongs to the emulator later; stand one in now.
	stand, err := standIn(bed, []int{8006, metricsPort})
	if err != nil {
		return err
	}
	defer stand()
	plan, err := containment.NewPlan(spec, containment.GuardPolicy())
	if err != nil {
		return err
	}
	runner := &containment.Runner{ProbePath: probePath, GuestDir: "/tmp"}
	res, err := runner.Run(ctx, containment.AgentGuest{Agent: qga.New(qga.Options{}).Agent(ga.Socket)}, plan)
	if err != nil {
		return err
	}
	if err := res.WriteText(w); err != nil {
		return err
	}
	if res.Passed() || !res.ControlsOK {
		return errors.New("with no guard the check must fail on the leaks and pass its positive controls")
	}
	fmt.Fprintf(w, "=> %d leaks seen with no guard (expected: the bed can see what the guard must stop)\n", len(res.Failed()))
	for _, g := range []int{801, 802} {
		if err := bed.StopGuest(ctx, g); err != nil {
			return err
		}
	}
	for _, z := range []string{"leaka", "leakb"} {
		if err := bed.RemoveZone(ctx, z); err != nil {
			return err
		}
	}
	return nil
}

// standIn listens on ports of the node until the returned func is called.
func standIn(bed *testvm.Bed, ports []int) (func(), error) {
	var lns []net.Listener
	closeAll := func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}
	for _, p := range ports {
		var ln net.Listener
		err := bed.Do(bed.NodeNS(), func() error {
			var err error
			ln, err = net.Listen("tcp", fmt.Sprintf(":%d", p))
			return err
		})
		if err != nil {
			closeAll()
			return nil, err
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
	}
	return closeAll, nil
}

// startEmulator serves the Proxmox API emulator on the node's :8006 with a
// self-signed certificate, a template and the daemon's pool-limited token.
// o gives the emulator's Release, RootPassword and Backend (the bed's
// when nil; the rest is the bed's).
func startEmulator(ctx context.Context, bed *testvm.Bed, o pveemu.Options, ctRootfs string) (emu *pveemu.Server, caFile, tokenID, secretFile string, err error) {
	backend := o.Backend
	if backend == nil {
		backend = pveemu.BedBackend{Bed: bed}
	}
	emu, err = pveemu.New(pveemu.Options{Node: "pve", Backend: backend, DataDir: filepath.Join(bed.Dir(), "pveemu"),
		Release: o.Release, RootPassword: o.RootPassword})
	if err != nil {
		return nil, "", "", "", err
	}
	defer func() {
		if err != nil {
			_ = emu.Close()
		}
	}()
	cert, _, err := pveemu.SelfSignedCert("127.0.0.1", "localhost", testvm.NodeMgmtAddr)
	if err != nil {
		return nil, "", "", "", err
	}
	var ln net.Listener
	if err := bed.Do(bed.NodeNS(), func() error {
		ln, err = net.Listen("tcp", ":8006")
		return err
	}); err != nil {
		return nil, "", "", "", err
	}
	srv := &http.Server{Handler: emu, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		_ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}))
	}()
	go func() { <-ctx.Done(); _ = srv.Close() }()

	dir := filepath.Join(bed.Dir(), "demo")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", "", "", err
	}
	caFile = filepath.Join(dir, "pve-root-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		return nil, "", "", "", err
	}
	// As pve-access-setup does: the template's storage in the pool, so the
	// pool's ACL reaches /storage/local-lvm (clone and resize need
	// Datastore.AllocateSpace there).
	if err := emu.AddSandboxTemplate(ctx, templateID, filepath.Join(bed.Dir(), "template-disk"), "pve-inspectd sandboxes"); err != nil {
		return nil, "", "", "", err
	}
	// Exactly what packaging/deb/pve-access-setup creates with
	// PVE_INSPECTD_TRANSFER_STORAGE=local (so that --disk-transfer-storage
	// local works): its roles, the pool (with the template's and the
	// transfer storage), SDN, the node's firewall, the cluster firewall
	// switch (read only) and the template.
	templates := []int{templateID}
	if ctRootfs != "" {
		// a container template (pve-access-setup grants it as a VM
		// template: its id in PVE_INSPECTD_TEMPLATES)
		if err := emu.AddCTTemplate(ctTemplateID, ctTemplate, ctRootfs, map[string]string{"net0": "name=eth0,bridge=vmbr0,ip=dhcp"}); err != nil {
			return nil, "", "", "", err
		}
		templates = append(templates, ctTemplateID)
	}
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: templates, Transfer: access.TransferStorage})
	if err != nil {
		return nil, "", "", "", err
	}
	// and root's one step after it: the cluster firewall on
	emu.EnableClusterFirewall()
	secretFile = filepath.Join(dir, "pve-token")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		return nil, "", "", "", err
	}
	return emu, caFile, id, secretFile, nil
}

// writeConfig writes the daemon's configuration for the bed's node.
// apiExtra and mcpExtra hold more [api] and [mcp] keys (the playground's
// TCP listener and secrets file).
func writeConfig(dir string, bed *testvm.Bed, probePath, caFile, tokenID, secretFile, apiExtra, mcpExtra string) (cfgPath, sock, marker string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", "", err
	}
	sock = filepath.Join(dir, "api.sock")
	marker = filepath.Join(dir, "inspect-proxmox-egress-lockdown")
	doc := fmt.Sprintf(`[node]
id = "pve"

[guard]
dnsmasq_user = "dnsmasq"
state_dir = %q
node_root = %q

[metrics]
listen = "0.0.0.0:%d"

[lockdown]
marker = %q
resolver = %q
backup_dir = %q
state_file = %q
reassert_interval = "5s"

[lockdown.dnsmasq]
cmdline_contains = [%q]

[halt]
state_file = %q

[check]
probe_path = %q
lan = ["%s:80"]
public = [%q]
public6 = [%q]
external_name = "{random}.%s"
local_name = "gateway.{zone}.test"

# The bed's resolver: the node's /etc/resolv.conf is the machine's, out
# of the bed's reach.
[egress]
upstreams = ["%s:53"]

[api]
enabled = true
socket = %q
state_dir = %q
token_file = %q
qga_dir = %q
templates = { debian = %d }
agent_timeout = "2m"
%s
[api.proxmox]
url = "https://127.0.0.1:8006/api2/json"
node = "pve"
token_id = %q
secret_file = %q
ca_file = %q

[mcp]
default_template = "debian"
%s`, filepath.Join(dir, "guard"), bed.NodeRoot(), metricsPort, marker, bed.ResolvConf(), filepath.Join(dir, "lockdown"), filepath.Join(dir, "lockdown.json"),
		bed.ResolvConf(), filepath.Join(dir, "halted"), probePath, testvm.LANAddr, testvm.InternetAddr, testvm.InternetAddr6, testvm.InternetName,
		testvm.InternetAddr, sock, filepath.Join(dir, "api-state"), filepath.Join(dir, "tokens.json"), bed.QGADir(), templateID, apiExtra, tokenID, secretFile, caFile, mcpExtra)
	cfgPath = filepath.Join(dir, "config.toml")
	return cfgPath, sock, marker, os.WriteFile(cfgPath, []byte(doc), 0o600)
}

// startDaemon runs `pve-inspectd run` in the node's network namespace and
// waits for its API to answer.
func startDaemon(ctx context.Context, w io.Writer, bed *testvm.Bed, inspectd, cfgPath, sock string) (func(), error) {
	logPath := filepath.Join(filepath.Dir(cfgPath), "pve-inspectd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", bed.NodeNS(), inspectd, "-c", cfgPath, "run")
	cmd.Stdout, cmd.Stderr = logf, logf
	waited, err := deathsig.Start(cmd, syscall.SIGTERM)
	if err != nil {
		logf.Close()
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- <-waited; logf.Close() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		fmt.Fprintln(w, "pve-inspectd stopped (its table stays in the kernel until the node namespace goes)")
	}
	c := client.NewUnix(sock)
	deadline := time.Now().Add(90 * time.Second)
	for {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err == nil {
			fmt.Fprintf(w, "pve-inspectd ready: API %s on %s (log %s)\n", h.Status, sock, logPath)
			return stop, nil
		}
		select {
		case err := <-done:
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("pve-inspectd exited: %v\n%s", err, lastLines(string(b), 30))
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("pve-inspectd not ready after 90s:\n%s", lastLines(string(b), 30))
		}
	}
}

// check runs `pve-inspectd check SANDBOX` (the CLI over the API) and
// prints its table.
func check(ctx context.Context, w io.Writer, bed *testvm.Bed, inspectd, cfgPath, id string) error {
	out, err := bed.Command(ctx, bed.NodeNS(), inspectd, "-c", cfgPath, "check", id).CombinedOutput()
	fmt.Fprintf(w, "%s", out)
	if err != nil {
		return fmt.Errorf("containment check did not pass: %w", err)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
