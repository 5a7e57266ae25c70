package config

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TemplatesSection is [templates]: template builds on request of the
// sandbox API (POST /v1/templates/build). Off by default. A build makes
// Proxmox download a URL to the node (download-url needs
// Sys.AccessNetwork, which lets its caller probe the node's network), so
// it runs with a credential of its own, BuilderUser's password read from
// BuilderPasswordFile at each build, never with the daemon's pool-scoped
// sandbox token; the route is a node operation, refused to owner-bound
// tokens.
type TemplatesSection struct {
	// Build turns the API's builds on.
	Build bool `toml:"build"`
	// BuilderUser is the Proxmox user the builds log in as (root@pam).
	BuilderUser string `toml:"builder_user"`
	// BuilderPasswordFile holds its password: an absolute path to a file
	// that only root may read (mode 0600 or 0400, owned by root); the
	// daemon refuses to build with a file others may read.
	BuilderPasswordFile string `toml:"builder_password_file"`
	// Storage, ImageStorage, SnippetStorage, WorkStorage and Bridge are
	// `template build`'s --storage, --image-storage, --snippet-storage,
	// --work-storage and --bridge. An empty Bridge (the default) is the
	// build network the build makes, a guest bridge behind the host guard;
	// a bridge the guard treats as management or trusted is refused.
	Storage        string `toml:"storage"`
	ImageStorage   string `toml:"image_storage"`
	SnippetStorage string `toml:"snippet_storage"`
	WorkStorage    string `toml:"work_storage"`
	Bridge         string `toml:"bridge"`
	// AllowURLs takes builds from an image URL over the API (from); off,
	// only the shipped recipes are built there. Proxmox's download follows
	// redirects and resolves the URL's host again, which the daemon cannot
	// check: a URL an admin gives could make the node fetch what only it
	// reaches (its LAN, a metadata service).
	AllowURLs bool `toml:"allow_urls"`
	// Mirror is the base URL the shipped recipes' images and checksum
	// lists are fetched from instead of the distributions' servers (an
	// air-gapped site's own copy): MIRROR/RECIPE/FILE and
	// MIRROR/RECIPE/SHA512SUMS or SHA256SUMS, the distributions' file
	// names (templatebuild.MirrorRecipe). The mirror is then trusted as
	// the distributions' servers were: the checksum is still the line of
	// its list, which Proxmox verifies. Also `template build`'s default
	// --mirror.
	Mirror string `toml:"mirror"`
	// StateDir holds the build ledger (`template build --state-dir`): only
	// VMs a build on this node recorded there are reused or destroyed.
	StateDir string `toml:"state_dir"`
	// MaxUploadGiB bounds an image sent for a build over the API (PUT
	// /v1/templates/build/{name}/image; 20).
	MaxUploadGiB int `toml:"max_upload_gib"`
	// MaxUnpackedGiB bounds the disk a build unpacks from an image archive
	// (kali2025.4's .tar.xz: its disk.raw), and the archive's download
	// (`template build --max-unpacked-gib`; 64).
	MaxUnpackedGiB int `toml:"max_unpacked_gib"`
	// MaxBuilds is how many builds run at once on the node (1 or 2);
	// further requests wait their turn.
	MaxBuilds int `toml:"max_builds"`
	// AgentWait and CloudInitWait bound a build's first boot.
	AgentWait     time.Duration `toml:"agent_wait"`
	CloudInitWait time.Duration `toml:"cloud_init_wait"`
	// BuildTimeout bounds a whole build, from its first step to the
	// tagged template (`template build --build-timeout`; 4h): past it the
	// build fails naming the limit and the step it was in, and releases
	// its slot and locks, leaving what a cancelled build leaves. It also
	// bounds the builder's waits for one Proxmox task (a download).
	BuildTimeout time.Duration `toml:"build_timeout"`
	// LockDir holds the per-name build locks shared with `pve-inspectd
	// template build`.
	LockDir string `toml:"lock_dir"`
}

// Bounds of [templates] build_timeout (and --build-timeout).
const (
	MinBuildTimeout = 30 * time.Minute
	MaxBuildTimeout = 7 * 24 * time.Hour
)

// CheckBuildTimeout checks a build timeout: from MinBuildTimeout to
// MaxBuildTimeout, and longer than the first boot's waits for the agent
// and cloud-init together (a booted build that used them up would
// otherwise always time out).
func CheckBuildTimeout(timeout, agentWait, cloudInitWait time.Duration) error {
	if timeout < MinBuildTimeout || timeout > MaxBuildTimeout {
		return fmt.Errorf("%s: want %s to %s", timeout, MinBuildTimeout, MaxBuildTimeout)
	}
	if waits := agentWait + cloudInitWait; timeout <= waits {
		return fmt.Errorf("%s: want more than the first boot's waits, agent_wait %s and cloud_init_wait %s (%s together)", timeout, agentWait, cloudInitWait, waits)
	}
	return nil
}

// reBridgeName is a Linux interface name (IFNAMSIZ - 1 characters).
var reBridgeName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

func defaultTemplates() TemplatesSection {
	return TemplatesSection{BuilderUser: "root@pam", Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
		MaxBuilds: 1, MaxUploadGiB: 20, MaxUnpackedGiB: templatebuild.DefaultMaxUnpacked >> 30, AgentWait: 30 * time.Minute, CloudInitWait: 30 * time.Minute, LockDir: "/run/pve-inspectd",
		StateDir: templatebuild.DefaultStateDir, BuildTimeout: templatebuild.DefaultBuildTimeout}
}

func (t TemplatesSection) validate(prefix string) error {
	key := func(k string, format string, a ...any) error {
		return &KeyError{Key: prefix + "." + k, Err: fmt.Errorf(format, a...)}
	}
	if t.MaxBuilds < 1 || t.MaxBuilds > 2 {
		return key("max_builds", "%d: want 1 or 2 (each build downloads an image and boots a VM)", t.MaxBuilds)
	}
	if t.MaxUploadGiB < 1 || t.MaxUploadGiB > 1024 {
		return key("max_upload_gib", "%d: want 1 to 1024", t.MaxUploadGiB)
	}
	if t.MaxUnpackedGiB < 1 || t.MaxUnpackedGiB > 1024 {
		return key("max_unpacked_gib", "%d: want 1 to 1024", t.MaxUnpackedGiB)
	}
	if t.AgentWait < time.Minute || t.CloudInitWait < time.Minute {
		return key("agent_wait", "agent_wait %s and cloud_init_wait %s: want at least 1m each", t.AgentWait, t.CloudInitWait)
	}
	if err := CheckBuildTimeout(t.BuildTimeout, t.AgentWait, t.CloudInitWait); err != nil {
		return key("build_timeout", "%w", err)
	}
	if !filepath.IsAbs(t.LockDir) {
		return key("lock_dir", "%q: want an absolute path", t.LockDir)
	}
	if !filepath.IsAbs(t.StateDir) {
		return key("state_dir", "%q: want an absolute path", t.StateDir)
	}
	if t.Mirror != "" {
		if err := templatebuild.CheckMirror(t.Mirror); err != nil {
			return key("mirror", "%w", err)
		}
	}
	if t.Bridge != "" && !reBridgeName.MatchString(t.Bridge) {
		return key("bridge", "%q: want an interface name", t.Bridge)
	}
	if !t.Build {
		return nil
	}
	if name, realm, ok := strings.Cut(t.BuilderUser, "@"); !ok || name == "" || realm == "" || strings.Contains(t.BuilderUser, "!") {
		return key("builder_user", "%q: want a Proxmox user user@realm (an API token cannot be the builder: its secret file would be the daemon's kind)", t.BuilderUser)
	}
	if t.BuilderPasswordFile == "" || !filepath.IsAbs(t.BuilderPasswordFile) {
		return key("builder_password_file", "%q: build = true needs the absolute path of a root-only file holding %s's password", t.BuilderPasswordFile, t.BuilderUser)
	}
	for k, v := range map[string]string{"storage": t.Storage, "image_storage": t.ImageStorage, "snippet_storage": t.SnippetStorage} {
		if v == "" {
			return key(k, "must not be empty")
		}
	}
	return nil
}
