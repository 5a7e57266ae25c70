package deb

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// xferTemplate is the bed's sandbox template in TestUnitDiskTransfer.
const xferTemplate = 9000

// TestUnitDiskTransfer: the installed package's daemon, under its shipped
// unit (ProtectSystem=strict, PrivateDevices=yes, DevicePolicy=closed, no
// drop-in), moves a file bigger than disk_transfer_threshold into a
// sandbox VM and back through the disk path, as on a node: its token is
// the one pve-access-setup creates, the Proxmox API (the emulator) is
// across a veth pair in a network namespace the test makes, the dir
// storage "local" is at /var/lib/vz (the emulator's storage directory
// bound there) and the guest agents' sockets are in /var/run/qemu-server
// (the bed's, bound read-only). The guest's copy of the file has the sent
// bytes, the read returns them, both went through a transfer volume, and
// no image is left on the storage.
func TestUnitDiskTransfer(t *testing.T) {
	testkit.RequireRoot(t, "ip", "qemu-ga", "dnsmasq")
	v1, _ := debs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	bed, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.Close() })
	data := filepath.Join(bed.Dir(), "pveemu")
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: pveemu.BedBackend{Bed: bed}, DataDir: data, StoragePath: "/var/lib/vz"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	if err := emu.AddSandboxTemplate(ctx, xferTemplate, filepath.Join(bed.Dir(), "template-disk"), ""); err != nil {
		t.Fatal(err)
	}
	// Exactly what pve-access-setup creates, and root's step after it.
	tokenID, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{xferTemplate}, Transfer: "local"})
	if err != nil {
		t.Fatal(err)
	}
	emu.EnableClusterFirewall()
	// The storage's images directory, as Proxmox's activate_storage makes
	// it (the unit's ReadWritePaths=-/var/lib/vz/images needs it at start).
	storage := filepath.Join(data, "storage", "local")
	if err := os.MkdirAll(filepath.Join(storage, "images"), 0o755); err != nil {
		t.Fatal(err)
	}

	b := boot(t, sysbox.Options{Name: "pkg-unit-xfer", Binds: []sysbox.Bind{
		{Source: storage, Target: "/var/lib/vz"},
		{Source: bed.QGADir(), Target: "/var/run/qemu-server", ReadOnly: true},
	}})
	b.install(v1)

	// The API across a veth pair, with a certificate for its address.
	ln := b.apiListener()
	cert, _, err := pveemu.SelfSignedCert("198.51.100.1")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: emu, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { // owned by the test: ends with srv.Close
		_ = srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}))
	}()
	t.Cleanup(func() { _ = srv.Close() })

	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	cfg := fmt.Sprintf(`[guard]
mgmt_rules = false

[api]
enabled = true
templates = { debian = %d }
disk_transfer_storage = "local"
disk_transfer_threshold = 1048576
agent_timeout = "2m"
# the node is the emulator's, its bridges not this host's
verify_bridges = false

[api.proxmox]
url = "https://%s/api2/json"
node = "pve"
token_id = %q
secret_file = "/etc/pve-inspectd/pve-token"
ca_file = "/etc/pve-inspectd/pve-root-ca.pem"
`, xferTemplate, apiAddr, tokenID)
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{"/etc/pve-inspectd/pve-token", []byte(secret + "\n"), 0o600},
		{"/etc/pve-inspectd/pve-root-ca.pem", ca, 0o644},
		{"/etc/pve-inspectd/config.toml", []byte(cfg), 0o644},
	} {
		if err := b.WriteFile(b.ctx, f.path, f.data, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	// The shipped unit as installed: no drop-in.
	if out, _ := b.Exec(b.ctx, "sh", "-c", "ls /etc/systemd/system/pve-inspectd.service.d 2>/dev/null"); strings.TrimSpace(string(out)) != "" {
		t.Fatalf("a drop-in changes the shipped unit: %s", out)
	}
	b.run("systemctl", "restart", "pve-inspectd.service")
	b.requireGuardInForce()

	// The API socket in the container's /run, from the host.
	c := client.NewUnix(fmt.Sprintf("/proc/%d/root/run/pve-inspectd/api.sock", b.PID()))
	b.eventually(2*time.Minute, "the sandbox API ready", func() bool {
		_, err := c.List(ctx)
		return err == nil
	})
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create a sandbox through the daemon under its unit: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = c.Delete(context.Background(), sb.ID)
		}
	})
	volumes := func() int {
		n := 0
		for _, r := range emu.Requests() {
			if r.Method == "POST" && strings.HasSuffix(r.Route, "/storage/{storage}/content") {
				n++
			}
		}
		return n
	}
	images := func() []string {
		var left []string
		_ = filepath.Walk(filepath.Join(storage, "images"), func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				left = append(left, p)
			}
			return nil
		})
		return left
	}

	const size = 24 << 20
	up := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{25}), size), up)
	before := volumes()
	if err := c.WriteFile(ctx, sb.ID, "vm0", "/root/big", src, size, 0o640); err != nil {
		j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "30", "-u", "pve-inspectd.service")
		t.Fatalf("upload under the unit: %v\n%s", err, j)
	}
	if volumes() == before {
		t.Fatal("the upload allocated no transfer volume: the disk path was not taken")
	}
	res, err := c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sha256sum", "--", "/root/big"}, TimeoutSeconds: 300})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("sha256sum in the guest: %v %+v", err, res)
	}
	sent := hex.EncodeToString(up.Sum(nil))
	if got := strings.Fields(string(res.Stdout)); len(got) == 0 || got[0] != sent {
		t.Fatalf("the guest's file has sha256 %q, sent %s", res.Stdout, sent)
	}
	if left := images(); len(left) > 0 {
		t.Errorf("after the upload, images left on the storage: %v", left)
	}

	before = volumes()
	down := sha256.New()
	n, err := c.ReadFile(ctx, sb.ID, "vm0", "/root/big", down)
	if err != nil || n != size {
		j, _ := b.Exec(b.ctx, "journalctl", "--no-pager", "-n", "30", "-u", "pve-inspectd.service")
		t.Fatalf("download under the unit: %d bytes, %v\n%s", n, err, j)
	}
	if volumes() == before {
		t.Fatal("the download allocated no transfer volume: the disk path was not taken")
	}
	if got := hex.EncodeToString(down.Sum(nil)); got != sent {
		t.Fatalf("read back sha256 %s, sent %s", got, sent)
	}
	// The download's clean-up (detach, which frees the image) runs once the
	// last byte is sent, so the client can be done before it is.
	deadline := time.Now().Add(time.Minute)
	for left := images(); len(left) > 0; left = images() {
		if time.Now().After(deadline) {
			t.Errorf("a minute after the download, images left on the storage: %v", left)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	deleted = true
	if p := b.show("pve-inspectd.service", "ActiveState", "NRestarts"); p["ActiveState"] != "active" || p["NRestarts"] != "0" {
		t.Errorf("the daemon after the transfers: %v", p)
	}
}
