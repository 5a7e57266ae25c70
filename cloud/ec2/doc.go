// Package ec2 renders the cloud-init user-data for a Proxmox node on EC2 and
// launches the instance (DESIGN.md section 9).
//
// The user-data is a MIME multipart document with two parts: a cloud-config
// that writes the recipe's configuration and fetches pve-bootstrap (the
// download is installed only after its sha256 matches), and a tiny shell
// script that runs `pve-bootstrap node apply`. cloud-init runs the runcmd
// script and the shell part from the same directory in name order, so the
// shell part is named to sort after "runcmd". The same document seeds the
// nested KVM target's NoCloud disk. It is gzipped and base64-encoded and must
// stay under EC2's 16 KiB limit; Encode fails instead of truncating.
//
// Launch builds one RunInstances request: an instance type from the families
// that support nested virtualization (c8i, m8i, r8i and their flex
// variants, with CpuOptions.NestedVirtualization enabled) or a metal type;
// IMDSv2 required with a hop limit of 1, so a nested guest can never reach
// the metadata service even without the host guard; the IPv6 metadata
// endpoint disabled; tags; and the root volume size. Progress after boot is
// read from instance tags the node writes itself (TagReporter: the step and
// running/rebooting/failed/done), so nobody tails a log over SSM. For that
// the instance profile must allow ec2:CreateTags on the instance itself
// (scope it with an ec2:SourceInstanceARN condition); without it the node
// still provisions, and `pve-bootstrap node status` on the node tells where
// it is.
package ec2
