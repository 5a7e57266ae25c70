// Package api measures the sandbox API on the test bed, side by side
// with its baseline in one run: sandbox create-to-ready and delete (medians
// over Rounds) and Proxmox API requests per sandbox lifecycle on the Proxmox
// emulator with real qemu-ga guests; exec round trip through the HTTP API
// and through the guest agent client, both against the raw guest-exec +
// guest-exec-status loop (qgabench.RawExec, the qga section's baseline too)
// on the same VM, and through the MCP server's sandbox_exec against the
// HTTP API it calls; 64 MiB write+read through the API against the client.
// Needs root (the bed).
package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/bench"
	qgabench "github.com/pve-inspect/pve-inspect/bench/qga"
	"github.com/pve-inspect/pve-inspect/diskxfer"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// Options size a run; zero values take the defaults.
type Options struct {
	// Rounds is how many 2-VM sandboxes are created and deleted (20).
	Rounds int
	// Execs is how many execs each side runs (50).
	Execs int
	// FileRounds is how many 64 MiB write+read round trips each side runs (3).
	FileRounds int
	// DiskSizes are the file sizes at which the disk path through the API
	// is measured against the agent path (none by default; make bench
	// passes 256 MiB and 1 GiB).
	DiskSizes []int64
}

// DiskResult compares the disk path with the agent path at one size.
type DiskResult struct {
	Size                                     int64
	DiskMBps, DiskWriteMBps, DiskReadMBps    float64
	AgentMBps, AgentWriteMBps, AgentReadMBps float64
}

// Result holds the medians of one run.
type Result struct {
	CreateP50, DeleteP50   time.Duration
	CallsPerLifecycle      float64
	ExecAPIP50, ExecQGAP50 time.Duration
	// ExecRawP50 is the shared exec baseline: a bare guest-exec of
	// /bin/true and guest-exec-status every millisecond on one connection
	// (qgabench.RawExec), the same loop the qga section compares against.
	ExecRawP50 time.Duration
	// ExecMCPP50 is sandbox_exec through the MCP server (SDK in-memory
	// transport) over the same HTTP API.
	ExecMCPP50 time.Duration
	// Disk holds the disk path against the agent path per DiskSizes.
	Disk                     []DiskResult
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
	node, err := bench.NewEmuNode(ctx)
	if err != nil {
		return nil, err
	}
	defer node.Close()
	bed, emu, px, qc := node.Bed, node.Emu, node.PX, node.QGA
	// The disk path takes files from 128 MiB here, so the 64 MiB round
	// trip measures the API's agent path and the DiskSizes its disk path.
	eng, err := sandbox.New(sandbox.Options{
		Node:          "pve",
		Proxmox:       px,
		Guests:        qc.SandboxGuests(),
		QGADir:        bed.QGADir(),
		StateDir:      filepath.Join(bed.Dir(), "api-state"),
		Logger:        slog.New(slog.DiscardHandler),
		DiskTransfer:  diskxfer.New(px, diskxfer.Options{}),
		DiskThreshold: 128 << 20,
	})
	if err != nil {
		return nil, err
	}
	c, closeAPI, err := bench.Serve(ctx, eng, sandboxapi.Options{MaxFileBytes: 2 << 30})
	if err != nil {
		return nil, err
	}
	defer closeAPI()
	res := &Result{}

	// lifecycle
	req := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian"}}}
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
	res.CreateP50, res.DeleteP50 = bench.Median(creates), bench.Median(deletes)
	res.CallsPerLifecycle = float64(calls) / float64(o.Rounds)

	// guest I/O on one VM: API and raw client alternate
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	defer func() { _ = c.Delete(context.WithoutCancel(ctx), sb.ID) }()
	raw := qc.Agent(filepath.Join(bed.QGADir(), strconv.Itoa(sb.VMs[0].VMID)+".qga"))
	mcs, err := mcpSession(ctx, c)
	if err != nil {
		return nil, err
	}
	defer mcs.Close()
	// The sides take turns going first, so none gains from the agent's
	// state the one before left.
	sides := []struct {
		name string
		run  func() error
		took []time.Duration
	}{
		{"api", func() error {
			_, err := c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"true"}})
			return err
		}, nil},
		{"qga", func() error {
			_, err := raw.Exec(ctx, qga.ExecRequest{Argv: []string{"true"}})
			return err
		}, nil},
		{"raw guest-exec", func() error { return qgabench.RawExec(ctx, raw.Socket(), time.Millisecond) }, nil},
		{"mcp", func() error {
			r, err := mcs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": sb.ID, "vm": "vm0", "argv": []string{"true"}}})
			if err == nil && r.IsError {
				err = fmt.Errorf("tool error %v", r.Content)
			}
			return err
		}, nil},
	}
	for i := range o.Execs {
		for k := range sides {
			s := &sides[(i+k)%len(sides)]
			t0 := time.Now()
			if err := s.run(); err != nil {
				return nil, fmt.Errorf("exec via %s: %w", s.name, err)
			}
			s.took = append(s.took, time.Since(t0))
		}
	}
	viaAPI, viaQGA, viaRaw := sides[0].took, sides[1].took, sides[2].took
	res.ExecMCPP50 = bench.Median(sides[3].took)
	res.ExecAPIP50, res.ExecQGAP50, res.ExecRawP50 = bench.Median(viaAPI), bench.Median(viaQGA), bench.Median(viaRaw)

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
	res.FileAPIMBps, res.FileQGAMBps = mbps(bench.Median(apiT)), mbps(bench.Median(qgaT))

	for _, size := range o.DiskSizes {
		d, err := diskVsAgent(ctx, c, sb.ID, raw, size)
		if err != nil {
			return nil, err
		}
		res.Disk = append(res.Disk, d)
	}
	if res.PeakRSSKiB, err = peakRSS(); err != nil {
		return nil, err
	}

	fmt.Fprintf(w, "| measure | sandbox API | baseline | ratio |\n|---|---|---|---|\n")
	fmt.Fprintf(w, "| create-to-ready, 2-VM sandbox (p50 of %d) | %v | | |\n", o.Rounds, res.CreateP50.Round(time.Millisecond))
	fmt.Fprintf(w, "| delete, 2-VM sandbox (p50 of %d) | %v | | |\n", o.Rounds, res.DeleteP50.Round(time.Millisecond))
	fmt.Fprintf(w, "| Proxmox API requests per lifecycle (task polls included) | %.1f | | |\n", res.CallsPerLifecycle)
	us := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	fmt.Fprintf(w, "| exec `true` round trip (p50 of %d) | %v | %v (raw guest-exec + guest-exec-status loop, 1 ms polls) | %.2fx |\n", o.Execs,
		us(res.ExecAPIP50), us(res.ExecRawP50), float64(res.ExecAPIP50)/float64(res.ExecRawP50))
	fmt.Fprintf(w, "| exec `true` round trip, guest agent client alone (p50 of %d) | %v | %v (same raw loop) | %.2fx |\n", o.Execs,
		us(res.ExecQGAP50), us(res.ExecRawP50), float64(res.ExecQGAP50)/float64(res.ExecRawP50))
	fmt.Fprintf(w, "| exec `true` through MCP sandbox_exec (SDK in-memory transport, p50 of %d) | %v | %v (HTTP API exec, same run) | %.2fx |\n", o.Execs,
		us(res.ExecMCPP50), us(res.ExecAPIP50), float64(res.ExecMCPP50)/float64(res.ExecAPIP50))
	fmt.Fprintf(w, "| 64 MiB write+read through the agent path (p50 of %d) | %.1f MB/s | %.1f MB/s (guest agent client alone) | %.2fx |\n", o.FileRounds,
		res.FileAPIMBps, res.FileQGAMBps, res.FileAPIMBps/res.FileQGAMBps)
	for _, d := range res.Disk {
		fmt.Fprintf(w, "| %d MiB write+read through the disk path (1 round, sha256 checked) | %.1f MB/s (write %.1f, read %.1f) | %.1f MB/s (write %.1f, read %.1f; agent path: guest agent client) | %.2fx |\n",
			d.Size>>20, d.DiskMBps, d.DiskWriteMBps, d.DiskReadMBps, d.AgentMBps, d.AgentWriteMBps, d.AgentReadMBps, d.DiskMBps/d.AgentMBps)
	}
	fmt.Fprintf(w, "| peak RSS of the bench process (API server, emulator, clients and their buffers) | %d MiB | | |\n", res.PeakRSSKiB>>10)
	return res, nil
}

// mcpSession connects an MCP client to the MCP server over the SDK's
// in-memory transport; the server's tools call the API through c.
func mcpSession(ctx context.Context, c *client.Client) (*mcp.ClientSession, error) {
	st, ct := mcp.NewInMemoryTransports()
	if _, err := mcpserver.New(c, mcpserver.Options{}, apitype.ScopeAdmin).Connect(ctx, st, nil); err != nil {
		return nil, fmt.Errorf("mcp server: %w", err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "apibench", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp client: %w", err)
	}
	return cs, nil
}

// diskVsAgent writes and reads size bytes through the API (which takes the
// disk path at this size) and through the guest agent client (the agent
// path), checking sha256 on every leg.
func diskVsAgent(ctx context.Context, c *client.Client, sbID string, raw *qga.Agent, size int64) (DiskResult, error) {
	src := func() io.Reader { return io.LimitReader(mrand.NewChaCha8([32]byte{byte(size >> 20)}), size) }
	h := sha256.New()
	if _, err := io.Copy(h, src()); err != nil {
		return DiskResult{}, err
	}
	want := h.Sum(nil)
	check := func(what string, got hash.Hash) error {
		if !bytes.Equal(got.Sum(nil), want) {
			return fmt.Errorf("%s %d MiB: sha256 differs", what, size>>20)
		}
		return nil
	}
	mbps := func(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }
	r := DiskResult{Size: size}
	t0 := time.Now()
	if err := c.WriteFile(ctx, sbID, "vm0", "/root/disk-bench", src(), size, 0o600); err != nil {
		return r, fmt.Errorf("disk path write %d MiB: %w", size>>20, err)
	}
	t1 := time.Now()
	got := sha256.New()
	if _, err := c.ReadFile(ctx, sbID, "vm0", "/root/disk-bench", got); err != nil {
		return r, fmt.Errorf("disk path read %d MiB: %w", size>>20, err)
	}
	t2 := time.Now()
	if err := check("disk path", got); err != nil {
		return r, err
	}
	r.DiskWriteMBps, r.DiskReadMBps, r.DiskMBps = mbps(size, t1.Sub(t0)), mbps(size, t2.Sub(t1)), mbps(2*size, t2.Sub(t0))
	if err := raw.WriteFile(ctx, "/root/agent-bench", src(), 0o600); err != nil {
		return r, fmt.Errorf("agent path write %d MiB: %w", size>>20, err)
	}
	t3 := time.Now()
	got.Reset()
	if _, err := raw.ReadFile(ctx, "/root/agent-bench", got, 2*size); err != nil {
		return r, fmt.Errorf("agent path read %d MiB: %w", size>>20, err)
	}
	t4 := time.Now()
	if err := check("agent path", got); err != nil {
		return r, err
	}
	r.AgentWriteMBps, r.AgentReadMBps, r.AgentMBps = mbps(size, t3.Sub(t2)), mbps(size, t4.Sub(t3)), mbps(2*size, t4.Sub(t2))
	_, _ = raw.Exec(ctx, qga.ExecRequest{Argv: []string{"rm", "-f", "/root/disk-bench", "/root/agent-bench"}})
	return r, nil
}
