package apitype

import "time"

// States of a template build (TemplateBuild.State).
const (
	// BuildQueued: the build waits for one of the node's build slots.
	BuildQueued = "queued"
	// BuildRunning: the build runs (its progress grows).
	BuildRunning = "running"
	// BuildDone: the template exists (built now, or found: Reused).
	BuildDone = "done"
	// BuildFailed: the build ended with Error; a new request builds again
	// (every step is resumable).
	BuildFailed = "failed"
)

// TemplateBuildRequest is the body of POST /v1/templates/build: a
// template NAME from a shipped Recipe (debian13, ubuntu24.04, ...) or
// From an http(s) URL of a .qcow2/.raw/.vmdk/.ova image with its
// Checksum (an OVA names the disk inside it: OVADisk). Exactly one of
// Recipe and From. The build's mode (BuildMode) is part of its identity:
// POST /v1/templates/build takes none (a build from an upload does).
type TemplateBuildRequest struct {
	Name     string `json:"name"`
	Recipe   string `json:"recipe,omitempty"`
	From     string `json:"from,omitempty"`
	Checksum string `json:"checksum,omitempty"`
	OVADisk  string `json:"ova_disk,omitempty"`
	BuildMode
}

// BuildMode is how a template is built from its image, part of a build's
// identity beside the image: the zero value boots the image once
// (cloud-init installs the guest agent, the guest is sealed); ImportOnly
// imports the image's disks as they are, on DiskBus (scsi, ide or sata)
// with OSType (l26, win10 or win11), without booting it: no agent is
// installed, nothing in the guest is reset, every clone is identical.
type BuildMode struct {
	ImportOnly bool   `json:"import_only,omitempty"`
	DiskBus    string `json:"disk_bus,omitempty"`
	OSType     string `json:"os_type,omitempty"`
}

// TemplateBuild is the state of a node's build of a template (POST
// /v1/templates/build, GET /v1/templates/builds/{name}).
type TemplateBuild struct {
	Name   string `json:"name"`
	Recipe string `json:"recipe,omitempty"`
	From   string `json:"from,omitempty"`
	// State is queued, running, done or failed.
	State string `json:"state"`
	// VMID is the template's id once known.
	VMID int `json:"vmid,omitempty"`
	// Reused is set when the template existed already: nothing was built.
	Reused bool `json:"reused,omitempty"`
	// Joined is set on the answer of a request that joined a build of the
	// same template already queued or running.
	Joined bool `json:"joined,omitempty"`
	// BuildMode is how the template was (or is being) built: import_only
	// (with its disk_bus and os_type) for one imported without boot, as
	// the node's build ledger records it for a done one; absent for a
	// booted build.
	BuildMode
	// Image is the digest of the image a done build's template was built
	// from ("sha256:HEX", as the node's build ledger records it); absent
	// when the ledger does not say (a template of a recipe, or one built
	// before the ledger kept it). A client that finds a template by name
	// compares it with its own image's digest.
	Image string `json:"image,omitempty"`
	// Error says why a failed build failed.
	Error string `json:"error,omitempty"`
	// Progress holds the build's progress lines, oldest first (the last
	// MaxBuildProgress of them).
	Progress []string   `json:"progress"`
	Started  time.Time  `json:"started"`
	Finished *time.Time `json:"finished,omitempty"`
}

// TemplateInfo is GET /v1/templates/{name}: the VM template a create
// naming it clones on this node, and what the node's build ledger says of
// it. It answers every token of the node (read scope, owner-bound ones
// too, on nodes without builds as well): the image digest of an
// operator's template is visible to every tenant of the node; it names no
// owner.
type TemplateInfo struct {
	Name string `json:"name"`
	// VMID is the template's id (the VM a create naming it clones).
	VMID int `json:"vmid"`
	// Built is set when the node's template builds made it: its build
	// ledger records the VM as a template they sealed under its name.
	Built bool `json:"built"`
	// Image is the digest of the image it was built from ("sha256:HEX",
	// as the build ledger records it); absent when the ledger does not
	// say (not built here, a template of a recipe, or one built before
	// the ledger kept images). A client that finds a template by name
	// compares it with its own image's digest.
	Image string `json:"image,omitempty"`
	// BuildMode is how the builds made it, as the ledger records it:
	// import_only (with its disk_bus and os_type) for one imported
	// without boot; absent for a booted build or one not built here.
	BuildMode
}

// MaxBuildProgress bounds TemplateBuild.Progress.
const MaxBuildProgress = 200

// TemplateUpload is a build from an image the client sends (PUT
// /v1/templates/build/{name}/image?file=FILE&sha256=HEX&ova_disk=DISK
// (or &import_only=true&disk_bus=BUS&os_type=OS),
// the image as the body): File is its name (.ova, .qcow2, .raw or
// .vmdk), SHA256 its digest (Proxmox verifies it), OVADisk the disk
// inside an OVA to import (only for an .ova), Size its length in bytes
// (the body's Content-Length). Its BuildMode's fields are the query's
// import_only, disk_bus and os_type; an import-only build of an .ova
// imports every disk its OVF lists and names no OVADisk.
type TemplateUpload struct {
	Name    string `json:"name"`
	File    string `json:"file"`
	SHA256  string `json:"sha256"`
	OVADisk string `json:"ova_disk,omitempty"`
	Size    int64  `json:"size"`
	BuildMode
}

// UploadSource is TemplateBuild.From of a build from an uploaded image:
// "upload:" and the file's name.
const UploadSource = "upload:"

// DefaultMaxTemplateUpload is the default bound of an uploaded image
// (20 GiB; [templates] max_upload_gib).
const DefaultMaxTemplateUpload int64 = 20 << 30
