package api

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestRunQuick(t *testing.T) {
	testkit.RequireRoot(t, "qemu-ga", "dnsmasq", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o := Options{Rounds: 2, Execs: 3, FileRounds: 1, DiskSizes: []int64{130 << 20}}
	if os.Getenv("APIBENCH_FULL") != "" { // the full-size run, e.g. for the README figures
		o = Options{}
	}
	res, err := Run(ctx, o, &out)
	if err != nil {
		t.Fatal(err)
	}
	if res.CreateP50 <= 0 || res.CallsPerLifecycle <= 0 || res.ExecAPIP50 <= 0 || res.ExecMCPP50 <= 0 || res.FileAPIMBps <= 0 || res.FileQGAMBps <= 0 {
		t.Errorf("result %+v", res)
	}
	if len(res.Disk) != len(o.DiskSizes) || (len(res.Disk) > 0 && (res.Disk[0].DiskMBps <= 0 || res.Disk[0].AgentMBps <= 0)) {
		t.Errorf("disk path rows %+v", res.Disk)
	}
	if !strings.Contains(out.String(), "create-to-ready") || !strings.Contains(out.String(), "MCP sandbox_exec") || !strings.Contains(out.String(), "through the disk path") {
		t.Errorf("table %q", out.String())
	}
	t.Log("\n" + out.String())
}
