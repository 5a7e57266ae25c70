package templatebuild

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// CheckMirror checks an image mirror's base URL ([templates] mirror,
// --mirror) as it can be checked without the network: http or https with
// a host, no credentials (they would be logged), no query or fragment
// (the files are named by path), and a host that is not an address
// URLGuard refuses (loopback, link-local, metadata, ...). A host name is
// resolved and guarded when a build over the API uses it (MirrorRecipe's
// URLs go through the service's URLGuard).
func CheckMirror(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return fmt.Errorf("%q: want an http or https URL with a host", RedactURL(raw))
	}
	if u.User != nil {
		return fmt.Errorf("%q carries credentials: serve the mirror without them", u.Redacted())
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return fmt.Errorf("%q has a query or fragment: the mirror's files are found by their path alone", RedactURL(raw))
	}
	if _, err := netip.ParseAddr(u.Hostname()); err == nil {
		// an address is checked as the API's builds check one (no
		// resolver needed; the node's own addresses when it builds)
		if err := (URLGuard{}).Check(context.Background(), raw); err != nil {
			return err
		}
	}
	return nil
}

// MirrorRecipe is r with its image and checksum list taken from the
// mirror base instead of the distribution's server: base/NAME/FILE and
// base/NAME/LIST, FILE and LIST the file names of the recipe's URLs
// (debian13/debian-13-genericcloud-amd64.qcow2 and debian13/SHA512SUMS,
// ubuntu24.04/noble-server-cloudimg-amd64.ova and ubuntu24.04/SHA256SUMS,
// kali2025.4/kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz and
// kali2025.4/SHA256SUMS). The checksum is still the line of the image in
// the mirror's list, which Proxmox verifies the download against (the
// build itself, for an archive it unpacks): the mirror is trusted as the
// distribution's server was. A recipe without a name is returned as it is.
func MirrorRecipe(r Recipe, base string) (Recipe, error) {
	if base == "" || r.Name == "" || r.Image.URL == "" {
		return r, nil
	}
	if err := CheckMirror(base); err != nil {
		return r, fmt.Errorf("mirror %w", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return r, fmt.Errorf("mirror %q: %w", RedactURL(base), err)
	}
	at := func(raw string) (string, error) {
		f, err := url.Parse(raw)
		if err != nil {
			return "", fmt.Errorf("recipe %s: %w", r.Name, err)
		}
		m := *u
		m.Path = strings.TrimSuffix(u.Path, "/") + "/" + r.Name + "/" + path.Base(f.Path)
		m.RawPath = ""
		return m.String(), nil
	}
	if r.Image.URL, err = at(r.Image.URL); err != nil {
		return r, err
	}
	if r.Image.ChecksumURL != "" {
		if r.Image.ChecksumURL, err = at(r.Image.ChecksumURL); err != nil {
			return r, err
		}
	}
	return r, nil
}
