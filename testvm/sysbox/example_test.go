package sysbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// Boot a container with the stand-in Proxmox units and a unit of one's own,
// copy a binary in, run it, read unit state, reboot, clean up.
func Example() {
	ctx := context.Background()
	c, err := sysbox.Start(ctx, sysbox.Options{
		Name:   "demo",
		Units:  map[string]string{"hello.service": "[Service]\nExecStart=/usr/local/bin/hello\n[Install]\nWantedBy=multi-user.target\n"},
		Files:  []sysbox.File{{Path: "/etc/hello.conf", Data: []byte("greeting = hi\n")}},
		Rootfs: sysbox.RootfsOptions{Packages: []string{"iproute2"}}, // extra debootstrap --include
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.CopyIn(ctx, "bin/hello", "/usr/local/bin/hello"); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Exec(ctx, "systemctl", "start", "hello.service"); err != nil {
		log.Fatal(err) // an *sysbox.ExecError carrying the output
	}
	p, err := c.SystemctlShow(ctx, "pveproxy.service", "ActiveState", "UnitFileState")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(p["ActiveState"], p["UnitFileState"])
	if err := c.Restart(ctx); err != nil { // power cut and boot: /run is fresh
		log.Fatal(err)
	}
}
