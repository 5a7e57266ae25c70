package main

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// mirrorRecipes are the built-ins the playground's node builds on request
// ([templates] build): its mirror on the bed's uplink serves an image of
// each (a small valid qcow2, an OVA with its vmdk, a .tar.xz of a small
// disk.raw) with its checksum list.
var mirrorRecipes = []string{"debian13", "ubuntu24.04", "kali2025.4"}

// mirrorImageSize is the virtual size of the mirror's images (the
// recipes grow the disk to 16 GiB); mirrorRawSize the size of the raw
// disk of its archive (all of it uploaded by each build of it).
const (
	mirrorImageSize = 2 << 30
	mirrorRawSize   = 1 << 20
)

// mirrorBase is the mirror's base URL: the uplink's internet host serves
// Options.ImagesDir under /images/.
func mirrorBase() string { return testvm.ImagesURL("") }

// writeMirror writes dir as [templates] mirror lays a mirror out:
// dir/RECIPE/FILE and dir/RECIPE/LIST, the distribution's file names
// (templatebuild.MirrorRecipe), each list holding its image's line.
func writeMirror(dir string, recipes []string) error {
	for _, name := range recipes {
		r, ok := templatebuild.Recipes()[name]
		if !ok {
			return fmt.Errorf("mirror: no recipe %s", name)
		}
		img := pveemu.CloudQCOW2(mirrorImageSize)
		var err error
		switch {
		case r.Image.Disk != "":
			if img, err = pveemu.CloudOVA(strings.TrimSuffix(r.Image.File, ".ova")+".ovf", r.Image.Disk, mirrorImageSize); err != nil {
				return err
			}
		case r.Image.Unpack != "":
			if img, err = pveemu.CloudRawTarXZ(mirrorRawSize); err != nil {
				return err
			}
		}
		var sum []byte
		switch r.Image.ChecksumAlg {
		case "sha256":
			s := sha256.Sum256(img)
			sum = s[:]
		case "sha512":
			s := sha512.Sum512(img)
			sum = s[:]
		default:
			return fmt.Errorf("mirror: recipe %s: checksum algorithm %q", name, r.Image.ChecksumAlg)
		}
		u, err := url.Parse(r.Image.ChecksumURL)
		if err != nil {
			return fmt.Errorf("mirror: recipe %s: %w", name, err)
		}
		sub := filepath.Join(dir, name)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(sub, r.Image.Listed()), img, 0o644); err != nil {
			return err
		}
		list := hex.EncodeToString(sum) + "  " + r.Image.Listed() + "\n"
		if err := os.WriteFile(filepath.Join(sub, path.Base(u.Path)), []byte(list), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// buildRecipes are the built-ins the playground builds: all of
// mirrorRecipes but one the node already has a stand-in of (the reference
// plugin's ubuntu24.04, which a build of that name would refuse to
// replace).
func buildRecipes(referencePlugin bool) []string {
	if !referencePlugin {
		return mirrorRecipes
	}
	return slices.DeleteFunc(slices.Clone(mirrorRecipes), func(n string) bool { return n == "ubuntu24.04" })
}

// templatesSection is the playground's [templates]: builds on, as the
// emulator's root@pam (its password in a root-only file of dir), from the
// mirror, their locks and ledger in dir.
func templatesSection(dir, rootPassword string) (string, error) {
	pw := filepath.Join(dir, "builder-password")
	if err := os.WriteFile(pw, []byte(rootPassword+"\n"), 0o600); err != nil {
		return "", err
	}
	return fmt.Sprintf("\n[templates]\nbuild = true\nbuilder_user = \"root@pam\"\nbuilder_password_file = %q\nmirror = %q\n"+
		"lock_dir = %q\nstate_dir = %q\nagent_wait = \"5m\"\ncloud_init_wait = \"5m\"\n",
		pw, mirrorBase(), filepath.Join(dir, "build-locks"), filepath.Join(dir, "template-builds")), nil
}

// buildBackend is the bed's backend whose build VMs find cloud-init done:
// a bed guest's root is the host's, whose cloud-init (if any) never runs
// in it, so a VM started on the build network (only template builds put
// VMs there) gets /usr/local/bin/cloud-init answering "status: done", as
// an image's does once its first boot ran. Its template and the clones
// keep it.
type buildBackend struct{ pveemu.BedBackend }

// StartVM implements pveemu.Backend.
func (b buildBackend) StartVM(ctx context.Context, v pveemu.VMSpec) error {
	if v.VNet == templatebuild.BuildVNet {
		ci := filepath.Join(v.Disk, "upper", "usr", "local", "bin", "cloud-init")
		if err := os.MkdirAll(filepath.Dir(ci), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(ci, []byte("#!/bin/sh\necho 'status: done'\n"), 0o755); err != nil {
			return err
		}
	}
	return b.BedBackend.StartVM(ctx, v)
}
