package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	awsec2 "github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/spf13/cobra"

	cloudec2 "github.com/pve-inspect/pve-inspect/cloud/ec2"
	"github.com/pve-inspect/pve-inspect/provision"
)

// ec2Client is what launch and image need from EC2.
type ec2Client interface {
	cloudec2.API
	cloudec2.ImageAPI
}

func newEC2Client(ctx context.Context, region string) (ec2Client, error) {
	var opts []func(*config.LoadOptions) error
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("aws config: %w", err)
	}
	if cfg.Region == "" {
		return nil, fmt.Errorf("aws config: no region (--region or AWS_REGION)")
	}
	return awsec2.NewFromConfig(cfg), nil
}

// ec2TagReporter runs on the node: it finds its own instance over IMDSv2
// and writes progress tags on it.
func ec2TagReporter(ctx context.Context, kind string) (func(context.Context, string, string) error, error) {
	if kind != "ec2-tags" {
		return nil, fmt.Errorf("report %q: unknown", kind)
	}
	md := imds.New(imds.Options{})
	id, err := md.GetMetadata(ctx, &imds.GetMetadataInput{Path: "instance-id"})
	if err != nil {
		return nil, fmt.Errorf("imds instance-id: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(id.Content, 64))
	id.Content.Close()
	if err != nil {
		return nil, fmt.Errorf("imds instance-id: %w", err)
	}
	reg, err := md.GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil {
		return nil, fmt.Errorf("imds region: %w", err)
	}
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(reg.Region))
	if err != nil {
		return nil, fmt.Errorf("aws config: %w", err)
	}
	r := cloudec2.TagReporter{API: awsec2.NewFromConfig(cfg), InstanceID: strings.TrimSpace(string(b))}
	return r.Report, nil
}

type userDataFlags struct {
	nodeConfig   string
	binaryURL    string
	binarySHA256 string
}

func (u *userDataFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&u.nodeConfig, "node-config", "", "the node's recipe configuration (TOML), validated before use")
	cmd.Flags().StringVar(&u.binaryURL, "binary-url", "", "http(s) URL the node downloads pve-bootstrap from")
	cmd.Flags().StringVar(&u.binarySHA256, "binary-sha256", "", "sha256 of that binary (hex)")
	_ = cmd.MarkFlagRequired("node-config")
	_ = cmd.MarkFlagRequired("binary-url")
	_ = cmd.MarkFlagRequired("binary-sha256")
}

// render validates the node config, lets edit adjust it, and renders the
// user-data document.
func (u *userDataFlags) render(edit func(*provision.Config)) ([]byte, provision.Config, error) {
	cfg, err := provision.LoadConfig(u.nodeConfig)
	if err != nil {
		return nil, cfg, fmt.Errorf("node config %s: %w", u.nodeConfig, err)
	}
	if edit != nil {
		edit(&cfg)
		if err := cfg.Validate(); err != nil {
			return nil, cfg, err
		}
	}
	doc, err := cfg.Encode()
	if err != nil {
		return nil, cfg, err
	}
	raw, err := cloudec2.Render(cloudec2.UserData{Config: doc, BinaryURL: u.binaryURL, BinarySHA256: u.binarySHA256})
	return raw, cfg, err
}

func newEC2Cmd(d *deps) *cobra.Command {
	cmd := &cobra.Command{Use: "ec2", Short: "render user-data for and launch a Proxmox node on EC2"}

	ud := &userDataFlags{}
	var raw bool
	var out string
	userdata := &cobra.Command{
		Use: "userdata", Short: "render the cloud-init user-data (gzip+base64, under 16 KiB)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, _, err := ud.render(ec2Defaults)
			if err != nil {
				return err
			}
			enc, err := cloudec2.Encode(doc)
			if err != nil {
				return err
			}
			data := []byte(enc + "\n")
			if raw {
				data = doc
			}
			if out != "" && out != "-" {
				return os.WriteFile(out, data, 0o600)
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	ud.register(userdata)
	userdata.Flags().BoolVar(&raw, "raw", false, "print the multipart document instead of gzip+base64")
	userdata.Flags().StringVarP(&out, "output", "o", "-", "write to this file")

	lf := &launchFlags{}
	launch := &cobra.Command{
		Use: "launch", Short: "launch the instance and follow the node's progress", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return d.launch(cmd.Context(), cmd.OutOrStdout(), lf) },
	}
	lf.ud.register(launch)
	fl := launch.Flags()
	fl.StringVar(&lf.region, "region", "", "AWS region (default from the AWS config)")
	fl.StringVar(&lf.spec.ImageID, "image", "", "Debian 13 AMI id (ami-...)")
	fl.StringVar(&lf.spec.InstanceType, "type", "m8i.2xlarge", "c8i/m8i/r8i (nested virtualization) or a .metal type")
	fl.StringVar(&lf.spec.SubnetID, "subnet", "", "subnet id")
	fl.StringSliceVar(&lf.spec.SecurityGroupIDs, "security-group", nil, "security group ids")
	fl.StringVar(&lf.spec.KeyName, "key-name", "", "EC2 key pair for SSH")
	fl.StringVar(&lf.spec.InstanceProfile, "instance-profile", "", "IAM instance profile (needs ec2:CreateTags on itself for progress)")
	fl.Int32Var(&lf.spec.RootVolumeGiB, "root-gib", 100, "root volume size in GiB")
	fl.StringVar(&lf.spec.Name, "name", "", "instance Name tag (default: the node's host name)")
	fl.StringToStringVar(&lf.spec.Tags, "tag", nil, "extra tags key=value")
	fl.DurationVar(&lf.timeout, "timeout", 75*time.Minute, "how long to wait for the node to finish")
	fl.DurationVar(&lf.poll, "poll", 20*time.Second, "how often to read the node's progress")
	_ = launch.MarkFlagRequired("image")
	var is imageFlags
	image := &cobra.Command{
		Use:   "image",
		Short: "make an AMI of a built node (CreateImage), wait until it is available and print its id",
		Long: `image turns a node built by "ec2 launch" into an AMI. Instances launched from
it skip the build: "node apply" finds every build step done, and the
per-instance steps (host name, hosts, root password, API token, node
certificate) run again because the instance id is new.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return d.image(cmd.Context(), cmd.OutOrStdout(), &is) },
	}
	ifl := image.Flags()
	ifl.StringVar(&is.region, "region", "", "AWS region (default: the SDK's)")
	ifl.StringVar(&is.spec.InstanceID, "instance", "", "the built node's instance id")
	ifl.StringVar(&is.spec.Name, "name", "", "AMI name")
	ifl.StringVar(&is.spec.Description, "description", "Proxmox VE node built by pve-bootstrap", "AMI description")
	ifl.BoolVar(&is.spec.NoReboot, "no-reboot", false, "do not let EC2 reboot the instance (the file system may be inconsistent)")
	ifl.StringToStringVar(&is.spec.Tags, "tag", nil, "tags on the AMI key=value")
	ifl.DurationVar(&is.timeout, "timeout", time.Hour, "how long to wait for the AMI")
	ifl.DurationVar(&is.poll, "poll", 15*time.Second, "how often to ask for the AMI's state")
	_ = image.MarkFlagRequired("instance")
	_ = image.MarkFlagRequired("name")
	cmd.AddCommand(userdata, launch, image)
	return cmd
}

type imageFlags struct {
	region  string
	spec    cloudec2.ImageSpec
	timeout time.Duration
	poll    time.Duration
}

func (d *deps) image(ctx context.Context, w io.Writer, f *imageFlags) error {
	if _, err := cloudec2.CreateImageInput(f.spec); err != nil {
		return err
	}
	api, err := d.ec2(ctx, f.region)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "making an image of %s; waiting until it is available (timeout %s)\n", f.spec.InstanceID, f.timeout)
	id, err := cloudec2.CreateImage(ctx, api, f.spec, f.poll, f.timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "image %s available; launch nodes from it with: pve-bootstrap ec2 launch --image %s ...\n", id, id)
	return nil
}

type launchFlags struct {
	ud      userDataFlags
	region  string
	spec    cloudec2.Spec
	timeout time.Duration
	poll    time.Duration
}

func (d *deps) launch(ctx context.Context, w io.Writer, lf *launchFlags) error {
	doc, cfg, err := lf.ud.render(func(c *provision.Config) { ec2Defaults(c); c.Report = "ec2-tags" })
	if err != nil {
		return err
	}
	enc, err := cloudec2.Encode(doc)
	if err != nil {
		return err
	}
	spec := lf.spec
	spec.UserData = enc
	if spec.Name == "" {
		spec.Name = cfg.Hostname
	}
	if _, err := cloudec2.RunInstancesInput(spec); err != nil {
		return err
	}
	if spec.InstanceProfile == "" {
		fmt.Fprintln(w, "warning: no --instance-profile: the node cannot tag itself, so its progress stays invisible until the timeout")
	}
	api, err := d.ec2(ctx, lf.region)
	if err != nil {
		return err
	}
	id, err := cloudec2.Launch(ctx, api, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "launched %s (%s); following the node's progress (timeout %s)\n", id, spec.InstanceType, lf.timeout)
	inst, err := cloudec2.Wait(ctx, api, id, lf.poll, lf.timeout, func(i cloudec2.Instance) {
		// Tags are written by the node: quote them, never echo raw bytes.
		fmt.Fprintf(w, "%s  state=%s step=%q status=%q\n", time.Now().UTC().Format("15:04:05"), i.State, i.Tags[cloudec2.TagStep], i.Tags[cloudec2.TagStatus])
	})
	if err != nil {
		if spec.KeyName != "" {
			return fmt.Errorf("%w\nreach the node: ssh admin@%s, then `sudo pve-bootstrap node status`", err, inst.Address())
		}
		return err
	}
	fmt.Fprint(w, accessPaths(id, inst, spec, cfg))
	return nil
}

// ec2Defaults fills in what a node on EC2 needs unless the config says
// otherwise: the Amazon DNS server as the SDN resolver's upstream, as the
// reference node build does.
func ec2Defaults(c *provision.Config) {
	if c.Network.SDNResolver == "" {
		c.Network.SDNResolver = provision.EC2Resolver
	}
}

// accessPaths lists the ways into a ready node that it really has: SSH
// only with a key pair (the Debian image's admin user gets it), the
// Proxmox UI (root with the kept password, when one is kept), the
// daemon's token. Nothing on the node runs an SSM agent, so no SSM line.
func accessPaths(id string, inst cloudec2.Instance, spec cloudec2.Spec, cfg provision.Config) string {
	addr := inst.Address()
	var b strings.Builder
	fmt.Fprintf(&b, "node ready:\n  instance   %s\n", id)
	if inst.PublicIP == "" {
		fmt.Fprintf(&b, "  address    %s (private only: reach it from inside the VPC)\n", addr)
	}
	fmt.Fprintf(&b, "  proxmox    https://%s:8006/ (node %q; open tcp 8006 to you in the security group, or tunnel over ssh)\n", addr, cfg.Hostname)
	pw := cfg.Secrets.RootPasswordFile
	switch {
	case cfg.Secrets.RootPasswordHash != "":
		fmt.Fprintf(&b, "  login      root@pam with the password of secrets.root_password_hash\n")
	case pw != "":
		fmt.Fprintf(&b, "  login      root@pam, password in %s on the node (root only, 0600)\n", pw)
	default:
		fmt.Fprintf(&b, "  login      root@pam: the generated password went only to secrets.sink\n")
	}
	fmt.Fprintf(&b, "  api token  %s on the node (root only, 0600)\n", provision.TokenPath)
	if spec.KeyName == "" {
		fmt.Fprintf(&b, "  ssh        none: launched without --key-name\n")
		return b.String()
	}
	fmt.Fprintf(&b, "  ssh        ssh admin@%s (key pair %s)\n", addr, spec.KeyName)
	fmt.Fprintf(&b, "  tunnel     ssh -L 8006:localhost:8006 admin@%s, then https://localhost:8006/\n", addr)
	if pw != "" && cfg.Secrets.RootPasswordHash == "" {
		fmt.Fprintf(&b, "  password   ssh admin@%s sudo cat %s\n", addr, pw)
	}
	return b.String()
}
