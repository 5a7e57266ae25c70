// Package ec2 renders the cloud-init user-data for a Proxmox node on EC2 and
// launches the instance (DESIGN.md section 9).
package ec2
