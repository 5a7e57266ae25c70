package main

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/provision"
)

// deps are the parts that touch the machine; tests replace them.
type deps struct {
	runner     provision.Runner
	addrs      provision.AddrSource
	fetcher    func(root provision.Root) provision.Fetcher
	random     io.Reader
	executable func() (string, error)
	http       *http.Client
	stderr     io.Writer
	// reporter builds the progress reporter for `node apply` when the
	// config asks for one.
	reporter func(ctx context.Context, kind string) (func(context.Context, string, string) error, error)
	// ec2 builds the EC2 client for a region.
	ec2 func(ctx context.Context, region string) (ec2Client, error)
}

func defaultDeps() *deps {
	hc := &http.Client{Timeout: 30 * time.Minute}
	return &deps{
		runner:     provision.ExecRunner{},
		addrs:      provision.NetlinkAddrs{},
		fetcher:    func(root provision.Root) provision.Fetcher { return provision.HTTPFetcher{Client: hc, Root: root} },
		random:     rand.Reader,
		executable: os.Executable,
		http:       hc,
		stderr:     os.Stderr,
		reporter:   ec2TagReporter,
		ec2:        newEC2Client,
	}
}

func (d *deps) logger(component string) *slog.Logger {
	return slog.New(slog.NewTextHandler(d.stderr, nil)).With("component", component)
}

func newRootCmd(d *deps) *cobra.Command {
	root := &cobra.Command{
		Use:           "pve-bootstrap",
		Short:         "build a Proxmox VE 9 node (on EC2 or nested on KVM) with pve-inspectd",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newNodeCmd(d),
		newEC2Cmd(d),
		newNestedCmd(d),
		&cobra.Command{
			Use: "version", Short: "print the version", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				_, err := io.WriteString(cmd.OutOrStdout(), version+"\n")
				return err
			},
		},
	)
	return root
}
