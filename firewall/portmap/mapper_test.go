package portmap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

type fakeGuard struct {
	mu   sync.Mutex
	sets [][]firewall.Port
	err  error
}

func (f *fakeGuard) SetPorts(_ context.Context, p []firewall.Port) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, p)
	return f.err
}

func TestMapperOnce(t *testing.T) {
	root := t.TempDir()
	for p, s := range map[string]string{
		"etc/pve/qemu-server/101.conf":      "net0: virtio=BC:24:11:00:01:01,bridge=vneta\nnet1: virtio=BC:24:11:00:01:11,bridge=vmbr0\n",
		"etc/dnsmasq.d/zonea/ethers":        "BC:24:11:00:01:01,10.10.1.101\n",
		"var/lib/misc/dnsmasq.zoneb.leases": "0 bc:24:11:00:01:11 192.168.1.5 x *\n",
		"var/lib/misc/dnsmasq.Bad.leases":   "0 bc:24:11:00:01:01 10.10.1.99 x *\n",
	} {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fg := &fakeGuard{}
	m := &Mapper{Paths: Paths{Root: root}, Guard: fg}
	if _, err := m.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range fg.sets[0] {
		got = append(got, p.Name+"="+p.MAC.String()+fmt.Sprint(p.IPv4))
	}
	// every NIC, whatever its bridge; the invalid zone name "Bad" is not read
	want := "tap101i0=bc:24:11:00:01:01[10.10.1.101] tap101i1=bc:24:11:00:01:11[192.168.1.5]"
	if strings.Join(got, " ") != want {
		t.Fatalf("ports %v, want %s", got, want)
	}
	// a missing config directory is an error and sets nothing
	fg = &fakeGuard{}
	m = &Mapper{Paths: Paths{Root: t.TempDir()}, Guard: fg, Interval: 10 * time.Millisecond}
	if _, err := m.Once(context.Background()); err == nil || len(fg.sets) != 0 {
		t.Fatalf("err %v, sets %d", err, len(fg.sets))
	}
	// Run retries and returns nil when its context ends
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fg.err = errors.New("refused")
	done := make(chan error, 1)
	go func() {
		done <- (&Mapper{Paths: Paths{Root: root}, Guard: fg, Interval: 10 * time.Millisecond}).Run(ctx)
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		fg.mu.Lock()
		tries := len(fg.sets)
		fg.mu.Unlock()
		if tries >= 2 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("Run tried %d times in a minute, want retries", tries)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMapperWaitsForVMConfigs: a node without /etc/pve/qemu-server (no
// guest yet) is not an error: Run logs nothing above Debug and maps the
// first VM once its config appears (issue 35: an error at every start).
func TestMapperWaitsForVMConfigs(t *testing.T) {
	root := t.TempDir()
	fg := &fakeGuard{}
	var logs testkit.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&Mapper{Paths: Paths{Root: root}, Guard: fg, Interval: 10 * time.Millisecond, Log: log}).Run(ctx)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if _, _, err := (Paths{Root: root}).ReadVMs(); !errors.Is(err, ErrNoVMConfigs) {
		t.Fatalf("ReadVMs without the directory: %v", err)
	}
	conf := filepath.Join(root, "etc/pve/qemu-server/101.conf")
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("net0: virtio=BC:24:11:00:01:01,bridge=vneta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		fg.mu.Lock()
		mapped := len(fg.sets) > 0 && len(fg.sets[len(fg.sets)-1]) == 1 && fg.sets[len(fg.sets)-1][0].Name == "tap101i0"
		fg.mu.Unlock()
		if mapped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("VM 101 never mapped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := logs.String(); s != "" {
		t.Fatalf("logged while waiting for the directory:\n%s", s)
	}
}
