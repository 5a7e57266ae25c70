// Package templatebuild turns a cloud image into a hardened sandbox
// template on a Proxmox node: `pve-inspectd template build`.
//
// # Steps
//
// The build is a list of steps (Builder.Run), each idempotent, so a run
// that failed or was killed is resumed by running it again (Lock keeps two
// runs of one name apart: the second would destroy the first one's VM):
//
//  1. find: a template named as asked and tagged pvei-template (and
//     builtin-RECIPE for a recipe) is reused and nothing else happens; a
//     VM of that name tagged pvei-building (a half-built one from an
//     earlier run) is destroyed; any other VM of that name stops the build.
//     Only a VM the build ledger (ledger.go) records under the name and
//     in no pool is the build's; a reused template must also pass the
//     hardened profile.
//  2. image: the image is downloaded (download-url, content import,
//     Proxmox verifying the checksum) to a file of the build's name with
//     its digest (BuildFile), kept when already there with that digest,
//     refused when there with another (or with no checksum to check);
//     a --from volume is taken as it is. An archive Proxmox cannot
//     download (Image.Unpack: kali2025.4's .tar.xz) is downloaded by the
//     build itself, its member unpacked as it arrives (tarxz.go, every
//     member checked, the xz decoder's memory bounded: xzguard.go) and
//     uploaded (content import) under BuildFile's name of the archive's
//     digest, which is checked at the archive's end; a refused archive's
//     upload is freed (unpack.go). Its file is hashed, and hashed
//     again after the create's import (a changed file fails the build).
//  3. seed: the cloud-init user-data and network-config are written
//     (atomically) as snippets into the snippets directory of the snippets
//     storage, as Proxmox's storage configuration names it.
//  4. network and create: unless Options.Bridge names one, the build
//     network (network.go: a simple SDN zone, vnet and subnet with SNAT and
//     DHCP, a guest bridge to the host guard) is made or reused and
//     applied; then the VM (name = the template's name, tagged pvei-building)
//     with the disk imported from the image (import-from), a cloud-init
//     drive whose user and network data are those snippets (cicustom), and
//     the hardened VM profile's settings (hardening.CloneChanges of an
//     empty config) from the start; the disk is grown to the recipe's size.
//  5. boot: start; wait (bounded) for the guest agent that cloud-init
//     installs; `cloud-init status --wait` through the agent (bounded);
//     an image without cloud-init (exit 127) leaves the verdict to the
//     recipe's checks, which run next through the agent; then what no two
//     clones may share is removed in the guest (the machine id, which
//     systemd makes anew on a clone's first boot, the DHCP leases of the
//     build's boot, the random seed, cloud-init's instance state and logs,
//     and the SSH host keys, which a oneshot unit the seal enables makes
//     anew on a clone's first boot: see sealCommand).
//  6. seal: shut down; delete the cloud-init drive, cicustom and the
//     build's NIC (a clone gets its NICs from the daemon, and never one on
//     the build's bridge); check the hardened profile (no template failure
//     may remain); convert to a template; tag it inspect, builtin-RECIPE
//     (as the reference Inspect plugin tags its built-ins) and
//     pvei-template, which ends the building state.
//
// # Time
//
// A build has Options.Timeout ([templates] build_timeout, --build-timeout;
// DefaultBuildTimeout, 4 hours) from its first step to the tagged
// template (deadline.go): a source that sends a byte every few minutes
// (Proxmox's wget of it, or the build's own download of an archive, whose
// stall detector waits 5 minutes for a byte) would otherwise hold the
// build's slot, its name's lock and its image's lock until the daemon
// restarts. Past it the build's context ends as a cancel does: every call
// returns, the failure is a *TimeoutError naming the limit and the step
// of the last progress line, the locks and the slot are released by their
// owners, and what is left is what a cancelled build leaves (the VM,
// tagged building, kept by the daemon for the next build of the name to
// destroy, destroyed by the CLI; an archive's upload freed; an image
// downloaded whole kept for the next build). It also bounds the builder
// client's wait for one Proxmox task. A download-url task the build started
// and did not see end is stopped then (as at a cancel: Builder.stopDownload,
// pveapi StopTask as the task's owner); its worker removes its temporary
// file, and a file it finished first is kept for the next build. A stop
// that fails is logged and said, and the build fails as it would have.
//
// # Builds without boot
//
// With Options.Mode ImportOnly (importonly.go) steps 3 to 6 are replaced:
// the VM is created with every disk of the image imported on the mode's
// bus (scsi, ide or sata; for an OVA each disk Proxmox's import-metadata
// lists, in the OVF's order: the daemon parses nothing of the archive),
// the mode's ostype and the hardened profile, no cloud-init drive and no
// NIC; it is never started, and is checked, converted, recorded and
// tagged as in step 6. Nothing in the guest changes: no agent installed,
// no machine id or host key reset, every clone identical. The mode is
// recorded in the ledger beside the image's digest, and a template of
// the name built another way is never reused (find, Service).
//
// An OVA's guest is what import-metadata says of its OVF: one asking for
// UEFI firmware (bios ovmf: VMware's firmware efi) is created with bios
// ovmf and a new EFI vars disk of efitype 4m without pre-enrolled keys
// (hardening.NewEFIDisk, the disk a create asking firmware uefi gets; the
// OVA's own EFI variables are not in it, so the guest boots by its
// firmware's default path), and checked as the creates that may clone it
// want it (hardening.CheckTemplate: firmware uefi, which a node takes only
// with [api] allow_uefi, so a build on a node without it, Options.AllowUEFI
// off, is refused before the VM is created, and one built before the
// option was turned off is not reused there, UEFIAllowed; a clone keeps the template's
// EFI disk, pveapi ConfigureVM). Its memory and cores are the OVF's (create-args, within
// the API's bounds for a VM), else the generic 2048 MiB and 2 cores: no
// build request names them, and a sandbox's clone sets its own anyway
// (cores and memory_mib of its create, 1 and 1024 by default).
//
// # Why cicustom snippets and not an uploaded seed ISO
//
// The reference plugin builds a NoCloud ISO itself and uploads it. Here
// the build runs on the node, so it writes two small snippet files and
// lets Proxmox generate the seed on its own cloud-init drive
// (qemu-server Cloudinit.pm): no ISO writer in this project, and the drive
// is deleted from the config (which frees its volume) before the
// conversion, so the template has no cd-rom. The network-config snippet
// matches NICs by name (e*), not by MAC: a clone's NIC gets a new MAC, and
// the MAC-matched config Proxmox would generate leaves clones offline.
//
// # Privileges
//
// Downloading a URL to a storage lets its caller probe the node's network,
// so Proxmox wants Sys.AccessNetwork (or Sys.Audit+Sys.Modify on /) for
// it, beside Datastore.AllocateTemplate on the storage. The build is an operator's action with a user's ticket (root@pam by
// default), never the daemon's pool-scoped sandbox token, which must not
// hold those privileges.
//
// # Builds the daemon runs
//
// Service runs builds asked over the sandbox API (POST
// /v1/templates/build, [templates] build = true): one per template name
// (a second request joins it), at most two at once on the node, each in a
// goroutine its Run owns and cancels at shutdown (the cancelled build's
// VM, tagged building, is left for the next build to destroy, so the
// shutdown is not held up). It logs in with its own credential per build
// (ServiceOptions.Login), takes the same per-name Lock as the CLI, and
// publishes each progress line and the end as events; a template built
// or found is granted to the daemon's token (ServiceOptions.Grant) so
// that sandboxes clone it at once. A build from a URL
// is checked by URLGuard first: the node downloads as root, so a URL that
// names the node, loopback, link-local or a metadata service is refused.
// Service.Upload builds from an image the client sends (PUT
// /v1/templates/build/{name}/image): the body is streamed to the image
// storage (pveapi Client.UploadFile, Proxmox verifying its sha256) under
// UploadFile's name of its digest, then built as a volume on the node,
// booted or, with import_only, without boot, once the storage's status
// says it has room for the upload twice (pveproxy's spool and Proxmox's
// copy). An image storage Proxmox reports not active (a mount or a
// server gone) is unavailable, not full: the upload is refused naming it,
// an error the API answers 503 unavailable (sandbox.ErrNotConfigured).
//
// # What every token may know
//
// Catalog says, for each template name, which VM a create clones and
// whether the ledger records it as a build's, with the image digest it
// was built from (GET /v1/templates/{name}, any token of the node): the
// daemon's token's list of VMs and the ledger, looked at once per
// MaxAge at most whatever the rate of questions. Service.Template reads
// it too for a name no build of is remembered.
package templatebuild
