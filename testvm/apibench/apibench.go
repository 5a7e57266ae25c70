// Package apibench measures the sandbox API on the test bed, side by side
// with its baseline in one run: sandbox create-to-ready and delete (medians
// over Rounds) and Proxmox API requests per sandbox lifecycle on the Proxmox
// emulator with real qemu-ga guests; exec round trip through the HTTP API
// against the raw guest agent client on the same VM; 64 MiB write+read
// through the API against the client. Needs root (the bed).
package apibench

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/pve"
	"github.com/pve-inspect/pve-inspect/sandboxapi/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi/qgaguest"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// Options size a run; zero values take the defaults.
type Options struct {
	// Rounds is how many 2-VM sandboxes are created and deleted (20).
	Rounds int
	// Execs is how many execs each side runs (50).
	Execs int
	// FileRounds is how many 64 MiB write+read round trips each side runs (3).
	FileRounds int
}

// Result holds the medians of one run.
type Result struct {
	CreateP50, DeleteP50     time.Duration
	CallsPerLifecycle        float64
	ExecAPIP50, ExecQGAP50   time.Duration
	FileAPIMBps, FileQGAMBps float64
	// PeakRSSKiB is the peak resident memory of the bench process over the
	// section (VmHWM, reset at its start): an upper bound of what serving
	// this load costs the daemon, since the process also holds the
	// emulator, the clients and their 64 MiB buffers.
	PeakRSSKiB int64
}

// peakRSS reads VmHWM of this process; resetPeakRSS restarts it from the
// current RSS (clear_refs 5).
func peakRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

func resetPeakRSS() error { return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// Run brings a bed up, measures, prints a table to w and tears down.
func Run(ctx context.Context, o Options, w io.Writer) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("apibench: needs root (the test bed)")
	}
	if o.Rounds <= 0 {
		o.Rounds = 20
	}
	if o.Execs <= 0 {
		o.Execs = 50
	}
	if o.FileRounds <= 0 {
		o.FileRounds = 3
	}
	if err := resetPeakRSS(); err != nil {
		return nil, fmt.Errorf("reset peak RSS: %w", err)
	}
	bed, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return nil, err
	}
	defer bed.Close()
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: pveemu.BedBackend{Bed: bed}, DataDir: filepath.Join(bed.Dir(), "pveemu")})
	if err != nil {
		return nil, err
	}
	ts := httptest.NewTLSServer(emu)
	defer func() { ts.Close(); _ = emu.Close() }()
	tdisk := filepath.Join(bed.Dir(), "template-disk")
	if err := os.MkdirAll(filepath.Join(tdisk, "upper", "var", "tmp"), 0o755); err != nil {
		return nil, err
	}
	if err := emu.AddTemplate(ctx, 9000, "debian", tdisk, map[string]string{"net0": "virtio,bridge=vmbr0"}); err != nil {
		return nil, err
	}
	if err := emu.AddPool("pve-inspect", ""); err != nil {
		return nil, err
	}
	id, secret, err := emu.RootToken("bench")
	if err != nil {
		return nil, err
	}
	px, err := pve.New(pve.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: 50 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	qc := qga.New(qga.Options{})
	srv, err := sandboxapi.New(sandboxapi.Options{Node: "pve", Proxmox: px, Guests: qgaguest.Dialer(qc), QGADir: bed.QGADir(),
		StateDir: filepath.Join(bed.Dir(), "api-state"), MaxFileBytes: 128 << 20, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	if _, err := srv.Reconcile(ctx); err != nil {
		return nil, err
	}
	hs := httptest.NewServer(srv.LocalHandler())
	defer hs.Close()
	c := client.New(hs.URL)
	res := &Result{}

	// lifecycle
	req := sandboxapi.CreateRequest{VMs: []sandboxapi.VMRequest{{Template: "debian"}, {Template: "debian"}}}
	var creates, deletes []time.Duration
	calls := 0
	for range o.Rounds {
		before := len(emu.Requests())
		t0 := time.Now()
		sb, err := c.Create(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		t1 := time.Now()
		if err := c.Delete(ctx, sb.ID); err != nil {
			return nil, fmt.Errorf("delete: %w", err)
		}
		creates, deletes = append(creates, t1.Sub(t0)), append(deletes, time.Since(t1))
		calls += len(emu.Requests()) - before
	}
	res.CreateP50, res.DeleteP50 = median(creates), median(deletes)
	res.CallsPerLifecycle = float64(calls) / float64(o.Rounds)

	// guest I/O on one VM: API and raw client alternate
	sb, err := c.Create(ctx, sandboxapi.CreateRequest{VMs: []sandboxapi.VMRequest{{Template: "debian"}}})
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	defer func() { _ = c.Delete(context.WithoutCancel(ctx), sb.ID) }()
	raw := qc.Agent(filepath.Join(bed.QGADir(), strconv.Itoa(sb.VMs[0].VMID)+".qga"))
	var viaAPI, viaQGA []time.Duration
	for range o.Execs {
		t0 := time.Now()
		if _, err := c.Exec(ctx, sb.ID, "vm0", sandboxapi.ExecRequest{Argv: []string{"true"}}); err != nil {
			return nil, fmt.Errorf("exec via api: %w", err)
		}
		t1 := time.Now()
		if _, err := raw.Exec(ctx, qga.ExecRequest{Argv: []string{"true"}}); err != nil {
			return nil, fmt.Errorf("exec via qga: %w", err)
		}
		viaAPI, viaQGA = append(viaAPI, t1.Sub(t0)), append(viaQGA, time.Since(t1))
	}
	res.ExecAPIP50, res.ExecQGAP50 = median(viaAPI), median(viaQGA)

	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	var buf bytes.Buffer
	var apiT, qgaT []time.Duration
	for range o.FileRounds {
		t0 := time.Now()
		if err := c.WriteFile(ctx, sb.ID, "vm0", "/root/b", bytes.NewReader(data), int64(len(data)), 0); err != nil {
			return nil, fmt.Errorf("write via api: %w", err)
		}
		buf.Reset()
		if _, err := c.ReadFile(ctx, sb.ID, "vm0", "/root/b", &buf); err != nil || sha256.Sum256(buf.Bytes()) != want {
			return nil, fmt.Errorf("read via api: %v", err)
		}
		t1 := time.Now()
		if err := raw.WriteFile(ctx, "/root/c", bytes.NewReader(data), 0o644); err != nil {
			return nil, fmt.Errorf("write via qga: %w", err)
		}
		buf.Reset()
		if _, err := raw.ReadFile(ctx, "/root/c", &buf, 1<<30); err != nil || sha256.Sum256(buf.Bytes()) != want {
			return nil, fmt.Errorf("read via qga: %v", err)
		}
		apiT, qgaT = append(apiT, t1.Sub(t0)), append(qgaT, time.Since(t1))
	}
	mbps := func(d time.Duration) float64 { return 2 * 64 / d.Seconds() }
	res.FileAPIMBps, res.FileQGAMBps = mbps(median(apiT)), mbps(median(qgaT))

	if res.PeakRSSKiB, err = peakRSS(); err != nil {
		return nil, err
	}

	fmt.Fprintf(w, "| measure | sandbox API | baseline | ratio |\n|---|---|---|---|\n")
	fmt.Fprintf(w, "| create-to-ready, 2-VM sandbox (p50 of %d) | %v | | |\n", o.Rounds, res.CreateP50.Round(time.Millisecond))
	fmt.Fprintf(w, "| delete, 2-VM sandbox (p50 of %d) | %v | | |\n", o.Rounds, res.DeleteP50.Round(time.Millisecond))
	fmt.Fprintf(w, "| Proxmox API requests per lifecycle (task polls included) | %.1f | | |\n", res.CallsPerLifecycle)
	fmt.Fprintf(w, "| exec `true` round trip (p50 of %d) | %v | %v (raw qga client) | %.2fx |\n", o.Execs,
		res.ExecAPIP50.Round(10*time.Microsecond), res.ExecQGAP50.Round(10*time.Microsecond), float64(res.ExecAPIP50)/float64(res.ExecQGAP50))
	fmt.Fprintf(w, "| 64 MiB write+read (p50 of %d) | %.1f MB/s | %.1f MB/s (raw qga client) | %.2fx |\n", o.FileRounds,
		res.FileAPIMBps, res.FileQGAMBps, res.FileAPIMBps/res.FileQGAMBps)
	fmt.Fprintf(w, "| peak RSS of the bench process (API server, emulator, clients and their buffers) | %d MiB | | |\n", res.PeakRSSKiB>>10)
	return res, nil
}
