package templatebuild

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/pve-inspect/pve-inspect/pveapi"
)

// Image is where a template's disk comes from.
type Image struct {
	// URL is downloaded by the node (download-url, content import) to
	// File on the image storage. Empty for an image already on the node.
	URL string
	// File is the file in the image storage's import directory (.qcow2,
	// .raw, .vmdk or .ova).
	File string
	// Disk is, for an OVA, the disk inside it to import (the volume
	// STORAGE:import/FILE.ova/DISK).
	Disk string
	// Unpack is, for a URL of a .tar.xz archive (which Proxmox's
	// download-url does not import), the member of it that is the disk
	// (kali's disk.raw): the build downloads the archive itself, unpacks
	// that member as it arrives and uploads it to File (unpack.go). The
	// checksum is then the archive's.
	Unpack string
	// Volume is an image already on the node (STORAGE:import/FILE or
	// STORAGE:import/FILE.ova/DISK); set instead of URL.
	Volume string
	// Checksum is "ALG:HEX" (sha256 or sha512), known in advance.
	Checksum string
	// ChecksumURL names a checksum list published beside the image
	// (SHA512SUMS, SHA256SUMS lines "HEX  FILE"); the build fetches it and
	// takes the line of Listed(). ChecksumAlg is its algorithm.
	ChecksumURL, ChecksumAlg string
}

// Listed is the file name of the image's line in its checksum list: the
// archive's (the URL's last path element) for an image to unpack, else
// File.
func (img Image) Listed() string {
	if img.Unpack == "" {
		return img.File
	}
	u, err := url.Parse(img.URL)
	if err != nil {
		return img.File
	}
	return path.Base(u.Path)
}

// Recipe is how a template is built.
type Recipe struct {
	// Name is the recipe's name (the reference plugin's built-in name); the
	// template is tagged builtin-Name. Empty for a build from --from only.
	Name string
	// Image is the disk's source.
	Image Image
	// Packages are installed by cloud-init on first boot; qemu-guest-agent
	// always is.
	Packages []string
	// Checks run through the guest agent once cloud-init is done; each
	// must exit 0.
	Checks [][]string
	// Seal runs through the guest agent after the checks, before the
	// shutdown, each to exit 0: it removes what no two clones may share.
	Seal [][]string
	// DiskGiB grows the imported disk (0 keeps its size); MemoryMiB and
	// Cores size the build VM and so the template.
	DiskGiB, MemoryMiB, Cores int
}

// The reference plugin's first-boot packages (Inspect's default Docker
// image's equivalents: buildpack-deps and python3), as its cloud-init
// user-data lists them.
var referencePackages = []string{
	"autoconf", "automake", "bzip2", "default-libmysqlclient-dev", "dpkg-dev", "file", "g++", "gcc",
	"imagemagick", "libbz2-dev", "libc6-dev", "libcurl4-openssl-dev", "libdb-dev", "libevent-dev",
	"libffi-dev", "libgdbm-dev", "libglib2.0-dev", "libgmp-dev", "libjpeg-dev", "libkrb5-dev",
	"liblzma-dev", "libmagickcore-dev", "libmagickwand-dev", "libmaxminddb-dev", "libncurses-dev",
	"libpng-dev", "libpq-dev", "libreadline-dev", "libsqlite3-dev", "libssl-dev", "libtool",
	"libwebp-dev", "libxml2-dev", "libxslt1-dev", "libyaml-dev", "make", "patch", "unzip",
	"xz-utils", "zlib1g-dev", "python3", "python3-pip", "python3-venv", "python-is-python3",
}

// defaultChecks prove the agent and the packages the sandbox tools need.
var defaultChecks = [][]string{
	{"sh", "-c", "command -v qemu-ga"},
	{"dpkg-query", "-W", "qemu-guest-agent", "python3", "gcc", "make"},
}

// sealCommand empties what must differ between clones: the machine id
// (systemd makes a new one on a clone's first boot; systemd-networkd's
// DHCP client id derives from it, so clones that shared one would ask
// for one address), the DHCP client leases of the build's boot (a clone
// would ask for the build VM's address first), the random seed
// systemd-random-seed credits to the kernel's pool at boot (clones
// sharing it would start from one seed), cloud-init's instance state and
// logs (`cloud-init clean --logs`: a clone booted with a datasource is a
// new instance and the build's logs, with the build's network, go), and
// the SSH host keys (clones sharing them could impersonate each other).
//
// Host keys come back on a clone's first boot through a oneshot unit the
// seal installs (sshKeysUnit: `ssh-keygen -A` before ssh.service while no
// host key exists), not through cloud-init: a clone has no cloud-init
// drive (the daemon gives it none), so on Debian and Ubuntu cloud images
// ds-identify finds no datasource and cloud-init stays disabled, and its
// ssh module, which would make the keys, never runs. ssh-keygen -A is
// openssh's own "generate every missing host key type", present on both;
// without it, sshd's ExecStartPre (sshd -t) would fail for want of keys.
var sealCommand = []string{"sh", "-c", "rm -f /var/lib/dhcp/*.leases /var/lib/dhcpcd/*.lease /var/lib/dbus/machine-id /var/lib/systemd/random-seed && truncate -s 0 /etc/machine-id && " +
	"if command -v cloud-init >/dev/null; then cloud-init clean --logs; fi && " +
	"if [ -d /etc/ssh ]; then printf '%s' \"$0\" > /etc/systemd/system/pvei-ssh-hostkeys.service && systemctl enable pvei-ssh-hostkeys.service && rm -f /etc/ssh/ssh_host_*; fi",
	sshKeysUnit}

// sshKeysUnit makes the SSH host keys on the first boot that has none.
const sshKeysUnit = `[Unit]
Description=Generate the SSH host keys of a clone of a pve-inspect template
ConditionPathExistsGlob=!/etc/ssh/ssh_host_*_key
Before=ssh.service sshd.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
`

// Recipes are the shipped recipes: the reference Inspect plugin's
// built-ins (proxmoxsandbox/_impl/built_in_vm.py), with its URLs.
func Recipes() map[string]Recipe {
	base := func(name string, img Image) Recipe {
		return Recipe{Name: name, Image: img, Packages: slices.Clone(referencePackages), Checks: slices.Clone(defaultChecks), Seal: [][]string{sealCommand}, DiskGiB: 16, MemoryMiB: 2048, Cores: 2}
	}
	return map[string]Recipe{
		"debian13": base("debian13", Image{
			URL:         "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2",
			File:        "debian-13-genericcloud-amd64.qcow2",
			ChecksumURL: "https://cloud.debian.org/images/cloud/trixie/latest/SHA512SUMS", ChecksumAlg: "sha512",
		}),
		"ubuntu24.04": base("ubuntu24.04", Image{
			URL:         "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.ova",
			File:        "noble-server-cloudimg-amd64.ova",
			Disk:        "ubuntu-noble-24.04-cloudimg.vmdk",
			ChecksumURL: "https://cloud-images.ubuntu.com/noble/current/SHA256SUMS", ChecksumAlg: "sha256",
		}),
		// Kali publishes its cloud image only as a .tar.xz of disk.raw;
		// its release directories hold a SHA256SUMS (assumed from Kali's
		// layout: not checked from here).
		"kali2025.4": base("kali2025.4", Image{
			URL:         "https://kali.download/cloud-images/kali-2025.4/kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz",
			File:        "kali-2025.4-genericcloud-amd64.raw",
			Unpack:      "disk.raw",
			ChecksumURL: "https://kali.download/cloud-images/kali-2025.4/SHA256SUMS", ChecksumAlg: "sha256",
		}),
	}
}

// RecipeNames lists the shipped recipes, sorted.
func RecipeNames() []string {
	var out []string
	for n := range Recipes() {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

var (
	reImportFile = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+=-]*\.(qcow2|raw|vmdk|ova)$`)
	reOVADisk    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+=-]*\.(qcow2|raw|vmdk)$`)
	reStorageID  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9\-_.]*$`)
	reHex        = regexp.MustCompile(`^[0-9a-f]+$`)
	// reTemplateName is qemu-server's VM name (pve-common dns-name).
	reTemplateName = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)*$`)
)

// checksumLen is the hex length of each accepted algorithm.
var checksumLen = map[string]int{"sha256": 64, "sha512": 128}

// ParseChecksum splits "ALG:HEX" (sha256 or sha512, lower-case hex of the
// algorithm's length).
func ParseChecksum(s string) (alg, sum string, err error) {
	alg, sum, ok := strings.Cut(s, ":")
	sum = strings.ToLower(sum)
	n, known := checksumLen[alg]
	if !ok || !known {
		return "", "", fmt.Errorf("checksum %q: want sha256:HEX or sha512:HEX", s)
	}
	if len(sum) != n || !reHex.MatchString(sum) {
		return "", "", fmt.Errorf("checksum %q: %s wants %d hex digits", s, alg, n)
	}
	if _, err := hex.DecodeString(sum); err != nil {
		return "", "", fmt.Errorf("checksum %q: %w", s, err)
	}
	return alg, sum, nil
}

// ImageFromURL is the image for --from URL (http or https: ftp, which
// download-url also takes, has no TLS): the file name is the URL's last
// path element as Proxmox normalizes it, which must be one Proxmox
// imports.
func ImageFromURL(raw, checksum, ovaDisk string) (Image, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Image{}, fmt.Errorf("--from %q: want an http(s) URL or a volume STORAGE:import/FILE", raw)
	}
	file := pveapi.NormalizeContentFilename(path.Base(u.Path))
	if !reImportFile.MatchString(file) {
		return Image{}, fmt.Errorf("--from %q: the file %q is not one Proxmox imports (.qcow2, .raw, .vmdk or .ova; for anything else unpack it on the node and build --from STORAGE:import/FILE)", raw, file)
	}
	if strings.HasSuffix(file, ".ova") != (ovaDisk != "") {
		return Image{}, fmt.Errorf("--from %q: an .ova names the disk inside it to import (--ova-disk DISK.vmdk), and only an .ova does", raw)
	}
	if ovaDisk != "" && !reOVADisk.MatchString(ovaDisk) {
		return Image{}, fmt.Errorf("--ova-disk %q: not a disk file name (.vmdk, .qcow2, .raw)", ovaDisk)
	}
	img := Image{URL: raw, File: file, Disk: ovaDisk}
	if checksum != "" {
		if _, _, err := ParseChecksum(checksum); err != nil {
			return Image{}, err
		}
		img.Checksum = checksum
	}
	return img, nil
}

// ImageFromVolume is the image for --from STORAGE:import/FILE (or
// STORAGE:import/FILE.ova/DISK): a file already in a storage's import
// directory, uploaded or unpacked there.
func ImageFromVolume(volid string) (Image, error) {
	storage, name, ok := strings.Cut(volid, ":")
	rest, isImport := strings.CutPrefix(name, "import/")
	if !ok || !reStorageID.MatchString(storage) || !isImport {
		return Image{}, fmt.Errorf("--from %q: want an http(s) URL or a volume STORAGE:import/FILE", volid)
	}
	file, disk, _ := strings.Cut(rest, "/")
	if !reImportFile.MatchString(file) {
		return Image{}, fmt.Errorf("--from %q: %q is not an importable file (.qcow2, .raw, .vmdk, .ova)", volid, file)
	}
	if strings.HasSuffix(file, ".ova") != (disk != "") {
		return Image{}, fmt.Errorf("--from %q: an .ova volume names the disk inside it (STORAGE:import/FILE.ova/DISK.vmdk), and only an .ova does", volid)
	}
	if disk != "" && !reOVADisk.MatchString(disk) {
		return Image{}, fmt.Errorf("--from %q: %q is not a disk of an OVA", volid, disk)
	}
	return Image{Volume: storage + ":import/" + file, File: file, Disk: disk}, nil
}

// ValidName checks a template name: a VM name qemu-server takes (a DNS
// name), at most 63 characters.
func ValidName(name string) error {
	if len(name) > 63 || !reTemplateName.MatchString(name) {
		return fmt.Errorf("template name %q: want a DNS name (letters, digits, '-' and '.'), at most 63 characters", name)
	}
	return nil
}

// ValidStorage checks a storage id.
func ValidStorage(flag, id string) error {
	if !reStorageID.MatchString(id) {
		return fmt.Errorf("--%s %q: not a storage id", flag, id)
	}
	return nil
}

// Generic is the recipe of a build from an image alone (--from without
// --recipe): the guest agent and nothing else, checked by its presence.
func Generic(img Image) Recipe {
	return Recipe{Image: img, Checks: [][]string{defaultChecks[0]}, Seal: [][]string{sealCommand}, MemoryMiB: 2048, Cores: 2}
}
