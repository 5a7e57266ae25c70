package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

var _ templatebuild.Proxmox = (*pveapi.Client)(nil)

// buildFlags are `template build`'s options.
type buildFlags struct {
	recipe, from, checksum, ovaDisk     string
	upload                              string
	storage, imageStorage, snippetStore string
	workStorage, lockDir, stateDir      string
	mirror                              string
	bridge, user, passwordFile          string
	buildCIDR                           string
	keepFailed, unguarded, viaAPI       bool
	importOnly                          bool
	diskBus, osType                     string
	agentWait, cloudInitWait, poll      time.Duration
	buildTimeout                        time.Duration
	maxUnpackedGiB                      int
}

const templateBuildLong = `Builds a sandbox template from a cloud image on this node, or reuses the one an
earlier build made. The image is downloaded by Proxmox (download-url, content
import) to --image-storage, the VM is created with its disk imported from it
(import-from) and the hardened VM profile, cloud-init installs the guest agent
and the recipe's packages on the first boot (user-data and network-config
written as snippets to --snippet-storage), the recipe's checks run through the
agent, and the VM is shut down, stripped of its cloud-init drive and NIC,
converted to a template named NAME and tagged inspect, pvei-template and
builtin-RECIPE. Each step is resumable: run it again after a failure.

The build VM boots an untrusted image, so it is not put on the node's own
bridges: the build makes (once, then reuses) an SDN network of its own, zone
` + templatebuild.BuildZone + `, vnet ` + templatebuild.BuildVNet + `, subnet --build-cidr with SNAT and DHCP, which
the host guard treats as a guest bridge (DHCP and DNS to the node, nothing
else of it, no LAN, no metadata; egress by [egress] default_mode, and none
under the egress lockdown). --bridge names another; a management or trusted
bridge (vmbr0) only with --unguarded-bridge. Only VMs this node's builds
recorded (--state-dir) are reused or destroyed.

Recipes (the reference Inspect plugin's built-ins): debian13, ubuntu24.04 (an
OVA), kali2025.4 (a .tar.xz, which Proxmox's download cannot import: this
command downloads it itself, unpacks its disk.raw as it arrives and uploads
that to --image-storage through Proxmox's upload, verifying the archive's
sha256 against Kali's SHA256SUMS at its end; --max-unpacked-gib bounds both).
--checksum ALG:HEX with --recipe alone replaces the recipe's checksum list.
--from URL builds from any .qcow2/.raw/.vmdk/.ova URL (--checksum sha256:HEX
or sha512:HEX has Proxmox verify it); --from STORAGE:import/FILE (or
FILE.ova/DISK.vmdk) from an image already on the node. --mirror URL (default
[templates] mirror) fetches a recipe's image and its checksum list from your
own server instead of the distribution's: URL/RECIPE/FILE and
URL/RECIPE/SHA512SUMS or SHA256SUMS, the distribution's file names; the
checksum is still the list's line, verified by Proxmox (by this command for
kali2025.4's archive).

--via-api asks the daemon to build instead (POST /v1/templates/build on the
local socket, [templates] build = true): it builds with its own builder
credential and [templates] settings, and this command prints the build's
progress; stopping it leaves the build running in the daemon. With --upload
FILE (and --ova-disk for an .ova) the daemon is sent a local image file
instead (PUT /v1/templates/build/NAME/image): it stores it on the node under
a name of its sha256, which Proxmox verifies, and builds from it.

--import-only builds without boot, the reference plugin's OVA import: the VM
is created with every disk of the image imported (an OVA named whole,
--from STORAGE:import/FILE.ova: each disk its OVF lists, as Proxmox's
import-metadata reads them) on --disk-bus (scsi, the default; ide or sata for
images without virtio drivers), with --os-type (l26, win10, win11), the
hardened profile and no cloud-init drive, and converted as it is: no guest
agent is installed and nothing in the guest is reset (machine id, SSH host
keys), so every clone is identical, and a sandbox VM of it needs the agent in
the image already. With --via-api it goes with --upload.

Privileges: this is an operator's action. download-url lets its caller probe
the node's network, so Proxmox wants Sys.AccessNetwork on the node for it
(beside Datastore.AllocateTemplate on the storage): the build logs in as --user (root@pam by default) with a password, never with the daemon's
sandbox token, which must not hold those privileges. Run it on the node as
root: it writes the snippets and hashes images in the storages' directories
and talks to the guest agent's socket.`

// newTemplateBuildCmd returns `template build NAME`.
func newTemplateBuildCmd(g *globals) *cobra.Command {
	var f buildFlags
	c := &cobra.Command{
		Use:   "build NAME (--recipe R | --from URL|VOLID)",
		Short: "build a sandbox template from a cloud image on this node (an operator's action: logs in as --user)",
		Long:  templateBuildLong,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.upload != "" {
				return f.uploadViaAPI(cmd, g, args[0])
			}
			recipe, err := f.buildRecipe()
			if err != nil {
				return err
			}
			o := templatebuild.Options{Name: args[0], Recipe: recipe, Mode: f.mode(), Storage: f.storage, ImageStorage: f.imageStorage,
				SnippetStorage: f.snippetStore, WorkStorage: f.workStorage, Bridge: f.bridge, Unguarded: f.unguarded, BuildCIDR: f.buildCIDR, KeepFailed: f.keepFailed, AgentWait: f.agentWait,
				CloudInitWait: f.cloudInitWait, MaxUnpacked: int64(f.maxUnpackedGiB) << 30, Timeout: f.buildTimeout, Progress: cmd.OutOrStdout(), Log: g.logger().With("component", "templatebuild")}
			if f.maxUnpackedGiB < 1 || f.maxUnpackedGiB > 1024 {
				return fmt.Errorf("--max-unpacked-gib %d: want 1 to 1024", f.maxUnpackedGiB)
			}
			if cmd.Flags().Changed("build-timeout") {
				if err := config.CheckBuildTimeout(f.buildTimeout, f.agentWait, f.cloudInitWait); err != nil {
					return fmt.Errorf("--build-timeout %w", err)
				}
			}
			if err := o.Validate(); err != nil {
				return err
			}
			if err := f.checkMirror(cmd); err != nil {
				return err
			}
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			if !f.viaAPI {
				if o.Recipe, err = f.mirrored(cmd, recipe, cfg.Templates.Mirror); err != nil {
					return err
				}
			}
			if f.viaAPI {
				if err := daemonDecides(cmd); err != nil {
					return err
				}
				if f.importOnly {
					return errors.New("--import-only with --via-api goes with --upload: the daemon builds without boot an image sent to it (on the node, build --from STORAGE:import/FILE --import-only)")
				}
				req := apitype.TemplateBuildRequest{Name: args[0], Recipe: f.recipe, From: f.from, Checksum: f.checksum, OVADisk: f.ovaDisk}
				return buildViaAPI(cmd.Context(), client.NewUnix(cfg.API.Socket), req, cmd.OutOrStdout(), f.poll)
			}
			if !cmd.Flags().Changed("build-timeout") {
				o.Timeout = cfg.Templates.BuildTimeout
			}
			if err := config.CheckBuildTimeout(o.Timeout, o.AgentWait, o.CloudInitWait); err != nil {
				return fmt.Errorf("--build-timeout (default [templates] build_timeout) %w", err)
			}
			if o.Protected, err = protectedBridges(cmd.Context(), cfg); err != nil {
				return err
			}
			// a UEFI OVA is built only where its clones may be created
			o.AllowUEFI = cfg.API.AllowUEFI
			pw, err := readPassword(f.passwordFile, cmd.InOrStdin())
			if err != nil {
				return err
			}
			po := proxmoxOptions(cfg)
			po.TaskTimeout = o.Timeout // a download of a cloud image: the build's bound
			px, err := pveapi.NewWithPassword(po, f.user, pw)
			if err != nil {
				return err
			}
			lockDir, stateDir := nodeDirs(cmd, cfg.Templates)
			o.LockDir = lockDir
			if !cmd.Flags().Changed("max-unpacked-gib") {
				o.MaxUnpacked = int64(cfg.Templates.MaxUnpackedGiB) << 30
			}
			b, err := templatebuild.New(px, templatebuild.AgentSockets(qga.New(qga.Options{}), cfg.API.QGADir), templatebuild.NodeHost{StateDir: stateDir}, o)
			if err != nil {
				return err
			}
			unlock, err := templatebuild.Lock(lockDir, args[0])
			if err != nil {
				return err
			}
			defer unlock()
			res, err := b.Run(cmd.Context())
			if err != nil {
				return err
			}
			writeReport(cmd.OutOrStdout(), res.VMID, res.Report)
			fmt.Fprintf(cmd.OutOrStdout(), "grant the daemon's token on it: PVE_INSPECTD_TEMPLATES=\"... %d\" /usr/lib/pve-inspectd/pve-access-setup\n", res.VMID)
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.recipe, "recipe", "", "a shipped recipe: "+strings.Join(templatebuild.RecipeNames(), ", "))
	fl.StringVar(&f.from, "from", "", "the image: an http(s) URL of a .qcow2/.raw/.vmdk/.ova, or a volume STORAGE:import/FILE already on the node (with --recipe: replaces the recipe's image)")
	fl.StringVar(&f.upload, "upload", "", "with --via-api: a local .ova/.qcow2/.raw/.vmdk file the daemon sends to the node (PUT /v1/templates/build/NAME/image; its sha256 verified by Proxmox) and builds from (an .ova names --ova-disk)")
	fl.StringVar(&f.checksum, "checksum", "", "with --from URL: sha256:HEX or sha512:HEX, verified by Proxmox; with --recipe alone: the image's digest instead of the recipe's checksum list (kali2025.4: its .tar.xz's)")
	fl.StringVar(&f.mirror, "mirror", "", "with --recipe: fetch the image and its checksum list from this base URL instead of the distribution's server (MIRROR/RECIPE/FILE, MIRROR/RECIPE/SHA512SUMS or SHA256SUMS; default [templates] mirror)")
	fl.StringVar(&f.ovaDisk, "ova-disk", "", "with --from URL or --upload of an .ova: the disk inside it to import (DISK.vmdk)")
	fl.StringVar(&f.storage, "storage", "local-lvm", "storage of the template's disk and the build's cloud-init drive")
	fl.StringVar(&f.imageStorage, "image-storage", "local", "storage the image is downloaded to (content import)")
	fl.StringVar(&f.snippetStore, "snippet-storage", "local", "storage the cloud-init snippets are written to (content snippets)")
	fl.StringVar(&f.workStorage, "work-storage", "", "for an OVA: the file-based storage with content images its disk is extracted on (default: the OVA's own storage)")
	fl.StringVar(&f.bridge, "bridge", "", "bridge of the build VM's NIC (default: the build network "+templatebuild.BuildVNet+" the build makes, a guest bridge to the host guard); it needs DHCP and a way to the package mirrors (the template keeps no NIC)")
	fl.BoolVar(&f.unguarded, "unguarded-bridge", false, "accept a --bridge the host guard treats as management or trusted: the freshly booted image then reaches the node, the LAN and the metadata services")
	fl.StringVar(&f.buildCIDR, "build-cidr", templatebuild.DefaultBuildCIDR, "subnet of the build network (SNAT and DHCP), when it is made")
	fl.StringVar(&f.user, "user", "root@pam", "Proxmox user to log in as (needs Sys.AccessNetwork, Datastore.AllocateTemplate, VM.Allocate, SDN.Allocate; not the daemon's token)")
	fl.StringVar(&f.passwordFile, "password-file", "", "file holding the user's password (\"-\" or empty: read one line from stdin)")
	fl.StringVar(&f.lockDir, "lock-dir", "/run/pve-inspectd", "directory of the lock that keeps two builds of one name apart (default [templates] lock_dir)")
	fl.StringVar(&f.stateDir, "state-dir", templatebuild.DefaultStateDir, "root-only directory of the record of the VMs this node's builds made: only those are reused or destroyed (default [templates] state_dir)")
	fl.BoolVar(&f.viaAPI, "via-api", false, "ask the daemon to build it (POST /v1/templates/build on the local socket; needs [templates] build = true): its credential and [templates] settings, progress followed here")
	fl.DurationVar(&f.poll, "poll", 2*time.Second, "with --via-api: how often the build's state is read")
	fl.BoolVar(&f.keepFailed, "keep-failed", false, "keep a failed build's VM for a look (the next build destroys it)")
	fl.DurationVar(&f.agentWait, "agent-wait", 30*time.Minute, "longest wait for the guest agent on the first boot")
	fl.DurationVar(&f.cloudInitWait, "cloud-init-wait", 30*time.Minute, "longest wait for cloud-init to finish")
	fl.DurationVar(&f.buildTimeout, "build-timeout", templatebuild.DefaultBuildTimeout, "longest time the whole build may take: past it it stops, saying in which step, as an interrupted one does (default [templates] build_timeout)")
	fl.BoolVar(&f.importOnly, "import-only", false, "build without boot: every disk of the image (of an .ova named whole, --from STORAGE:import/FILE.ova) imported as it is; no cloud-init, no guest agent installed, nothing reset in the guest")
	fl.StringVar(&f.diskBus, "disk-bus", "", "with --import-only: the bus of every disk, scsi (virtio-scsi, the default), ide or sata")
	fl.StringVar(&f.osType, "os-type", "", "with --import-only: the template's ostype, l26 (the default), win10 or win11")
	fl.IntVar(&f.maxUnpackedGiB, "max-unpacked-gib", templatebuild.DefaultMaxUnpacked>>30, "largest disk unpacked from an image archive (kali2025.4's disk.raw), and largest archive downloaded, in GiB (default [templates] max_unpacked_gib)")
	return c
}

// mode is the build's mode from --import-only, --disk-bus and --os-type
// (checked by templatebuild's Validate, or by the daemon).
func (f buildFlags) mode() templatebuild.Mode {
	return templatebuild.Mode{ImportOnly: f.importOnly, DiskBus: f.diskBus, OSType: f.osType}
}

// protectedBridges are the interfaces the host guard treats as
// management (a default route) or trusted: no build VM goes there
// unless --unguarded-bridge.
func protectedBridges(ctx context.Context, cfg config.Config) ([]string, error) {
	fc, err := daemon.FullGuardConfig(cfg)
	if err != nil {
		return nil, err
	}
	cls, err := firewall.Classify(ctx, fc)
	if err != nil {
		return nil, fmt.Errorf("classify interfaces: %w", err)
	}
	return append(slices.Clone(cls.Management), cls.Trusted...), nil
}

// buildRecipe resolves --recipe and --from into the recipe to build.
func (f buildFlags) buildRecipe() (templatebuild.Recipe, error) {
	var r templatebuild.Recipe
	if f.recipe != "" {
		var ok bool
		if r, ok = templatebuild.Recipes()[f.recipe]; !ok {
			return r, fmt.Errorf("--recipe %q: unknown; shipped: %s", f.recipe, strings.Join(templatebuild.RecipeNames(), ", "))
		}
	}
	if f.from == "" {
		if f.recipe == "" {
			return r, errors.New("want --recipe or --from (or both)")
		}
		if f.ovaDisk != "" {
			return r, errors.New("--ova-disk goes with --from URL")
		}
		if f.checksum != "" {
			// the image's digest instead of the recipe's checksum list
			if _, _, err := templatebuild.ParseChecksum(f.checksum); err != nil {
				return r, fmt.Errorf("--checksum: %w", err)
			}
			r.Image.Checksum, r.Image.ChecksumURL, r.Image.ChecksumAlg = f.checksum, "", ""
		}
		return r, nil
	}
	var img templatebuild.Image
	var err error
	switch {
	case f.importOnly && strings.Contains(f.from, "://"):
		return r, errors.New("--import-only builds from a volume on the node (--from STORAGE:import/FILE), or an upload (--upload --via-api): download the image to the node's import directory first")
	case f.importOnly && (f.checksum != "" || f.ovaDisk != ""):
		return r, errors.New("--checksum and --ova-disk do not go with --import-only --from VOLUME (every disk of an OVA is imported)")
	case f.importOnly:
		img, err = templatebuild.ImportVolume(f.from)
	case strings.Contains(f.from, "://"):
		img, err = templatebuild.ImageFromURL(f.from, f.checksum, f.ovaDisk)
	case f.checksum != "" || f.ovaDisk != "":
		return r, errors.New("--checksum and --ova-disk go with --from URL (a volume names its OVA disk itself: STORAGE:import/FILE.ova/DISK.vmdk)")
	default:
		img, err = templatebuild.ImageFromVolume(f.from)
	}
	if err != nil {
		return r, err
	}
	if f.recipe == "" {
		return templatebuild.Generic(img), nil
	}
	r.Image = img
	return r, nil
}

// checkMirror checks --mirror before anything is read: a base URL
// CheckMirror takes, with --recipe alone (--from names the image itself).
func (f buildFlags) checkMirror(cmd *cobra.Command) error {
	if !cmd.Flags().Changed("mirror") {
		return nil
	}
	if f.from != "" || f.recipe == "" {
		return errors.New("--mirror goes with --recipe alone: --from names the image itself")
	}
	if err := templatebuild.CheckMirror(f.mirror); err != nil {
		return fmt.Errorf("--mirror %w", err)
	}
	return nil
}

// mirrored is recipe from --mirror, or from [templates] mirror (cfgMirror)
// when the flag is not given; a build with --from keeps its image.
func (f buildFlags) mirrored(cmd *cobra.Command, recipe templatebuild.Recipe, cfgMirror string) (templatebuild.Recipe, error) {
	mirror, what := cfgMirror, "[templates] "
	if cmd.Flags().Changed("mirror") {
		mirror, what = f.mirror, "--"
	}
	if f.from != "" {
		return recipe, nil
	}
	r, err := templatebuild.MirrorRecipe(recipe, mirror)
	if err != nil {
		return recipe, fmt.Errorf("%s%w", what, err)
	}
	return r, nil
}

// nodeDirs are the build's lock and ledger directories: --lock-dir and
// --state-dir, by default [templates] lock_dir and state_dir, the daemon's
// own: a build of the CLI and one of the daemon take the same per-name
// lock and keep one ledger (with two, each would refuse, or take for a
// half-built one, the other's VM of the name).
func nodeDirs(cmd *cobra.Command, tc config.TemplatesSection) (lockDir, stateDir string) {
	lockDir, stateDir = tc.LockDir, tc.StateDir
	if fl := cmd.Flags().Lookup("lock-dir"); fl != nil && fl.Changed {
		lockDir = fl.Value.String()
	}
	if fl := cmd.Flags().Lookup("state-dir"); fl != nil && fl.Changed {
		stateDir = fl.Value.String()
	}
	return lockDir, stateDir
}

// daemonDecides refuses, with --via-api, the flags whose say is the
// daemon's ([templates] and its builder credential).
func daemonDecides(cmd *cobra.Command) error {
	for _, name := range []string{"storage", "image-storage", "snippet-storage", "work-storage", "bridge", "user", "password-file", "lock-dir", "state-dir", "mirror", "keep-failed", "agent-wait", "cloud-init-wait", "build-timeout", "max-unpacked-gib"} {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s with --via-api: the daemon builds with its [templates] settings and credential", name)
		}
	}
	return nil
}

// buildViaAPI asks the daemon for the build and prints its progress lines
// (looking every poll) until it is done or failed.
func buildViaAPI(ctx context.Context, c *client.Client, req apitype.TemplateBuildRequest, out io.Writer, poll time.Duration) error {
	st, err := c.BuildTemplate(ctx, req)
	if err != nil {
		return err
	}
	return followBuild(ctx, c, req.Name, st, out, poll)
}

// uploadViaAPI sends f.upload to the daemon for a build of name
// (--upload with --via-api) and follows the build.
func (f buildFlags) uploadViaAPI(cmd *cobra.Command, g *globals, name string) error {
	if !f.viaAPI {
		return errors.New("--upload goes with --via-api: on the node, copy the file to a storage's import directory and build --from STORAGE:import/FILE")
	}
	if f.recipe != "" || f.from != "" || f.checksum != "" {
		return errors.New("--upload takes no --recipe, --from or --checksum: its sha256 is computed here and verified by Proxmox")
	}
	if err := daemonDecides(cmd); err != nil {
		return err
	}
	cfg, err := g.loadConfig()
	if err != nil {
		return err
	}
	file, err := os.Open(f.upload)
	if err != nil {
		return err
	}
	defer func() { _ = file.Close() }()
	h := sha256.New()
	size, err := io.Copy(h, file)
	if err != nil {
		return fmt.Errorf("hash %s: %w", f.upload, err)
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return err
	}
	u := apitype.TemplateUpload{Name: name, File: filepath.Base(f.upload), SHA256: hex.EncodeToString(h.Sum(nil)), OVADisk: f.ovaDisk, Size: size,
		BuildMode: apitype.BuildMode(f.mode())}
	fmt.Fprintf(cmd.OutOrStdout(), "sending %s (%d bytes, sha256 %s) to the daemon\n", f.upload, size, u.SHA256)
	c := client.NewUnix(cfg.API.Socket)
	st, err := c.UploadTemplate(cmd.Context(), u, file)
	if err != nil {
		return err
	}
	return followBuild(cmd.Context(), c, name, st, cmd.OutOrStdout(), f.poll)
}

// followBuild prints the progress of the daemon's build of name (its
// state st) until it is done or failed.
func followBuild(ctx context.Context, c *client.Client, name string, st apitype.TemplateBuild, out io.Writer, poll time.Duration) error {
	req := apitype.TemplateBuildRequest{Name: name}
	var err error
	if st.Joined {
		fmt.Fprintf(out, "joined the daemon's build of %q\n", req.Name)
	}
	seen := 0
	for {
		for _, line := range st.Progress[min(seen, len(st.Progress)):] {
			fmt.Fprintln(out, line)
		}
		seen = max(seen, len(st.Progress))
		switch st.State {
		case apitype.BuildDone:
			if st.Reused {
				fmt.Fprintf(out, "template %q is VM %d, built earlier: reused\n", req.Name, st.VMID)
			}
			fmt.Fprintf(out, "grant the daemon's token on it: PVE_INSPECTD_TEMPLATES=\"... %d\" /usr/lib/pve-inspectd/pve-access-setup\n", st.VMID)
			return nil
		case apitype.BuildFailed:
			return fmt.Errorf("the daemon's build of %q failed: %s", req.Name, st.Error)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped following the build of %q (it goes on in the daemon: GET /v1/templates/builds/%s): %w", req.Name, req.Name, ctx.Err())
		case <-time.After(poll):
		}
		if st, err = c.TemplateBuild(ctx, req.Name); err != nil {
			return err
		}
	}
}
