package bench

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// EmuNode is the node in a box behind the Proxmox emulator, as the sandbox
// sections use it: a test bed, the emulator on it over TLS with the
// template 9000 "debian" (an empty overlay disk) and the pool
// "pve-inspect", a pveapi client with a root API token, and the guest
// agent client. Close it.
type EmuNode struct {
	Bed *testvm.Bed
	Emu *pveemu.Server
	PX  *pveapi.Client
	QGA *qga.Client
	ts  *httptest.Server
}

// NewEmuNode brings an EmuNode up (root: the bed).
func NewEmuNode(ctx context.Context) (*EmuNode, error) {
	bed, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return nil, err
	}
	n := &EmuNode{Bed: bed}
	if err := n.start(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *EmuNode) start(ctx context.Context) error {
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: pveemu.BedBackend{Bed: n.Bed}, DataDir: filepath.Join(n.Bed.Dir(), "pveemu")})
	if err != nil {
		return err
	}
	n.Emu = emu
	n.ts = httptest.NewTLSServer(emu)
	tdisk := filepath.Join(n.Bed.Dir(), "template-disk")
	if err := os.MkdirAll(filepath.Join(tdisk, "upper", "var", "tmp"), 0o755); err != nil {
		return err
	}
	if err := emu.AddTemplate(ctx, 9000, "debian", tdisk, map[string]string{"net0": "virtio,bridge=vmbr0"}); err != nil {
		return err
	}
	if err := emu.AddPool("pve-inspect", ""); err != nil {
		return err
	}
	id, secret, err := emu.RootToken("bench")
	if err != nil {
		return err
	}
	n.PX, err = pveapi.New(pveapi.Options{URL: n.ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: n.ts.Client(), TaskPoll: 50 * time.Millisecond})
	if err != nil {
		return fmt.Errorf("bench: proxmox client: %w", err)
	}
	n.QGA = qga.New(qga.Options{})
	return nil
}

// Close stops the emulator and tears the bed down.
func (n *EmuNode) Close() {
	if n.ts != nil {
		n.ts.Close()
	}
	if n.Emu != nil {
		_ = n.Emu.Close()
	}
	_ = n.Bed.Close()
}
