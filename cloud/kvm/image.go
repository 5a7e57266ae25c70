package kvm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Debian 13 ("trixie") generic cloud image and its checksum list.
const (
	DefaultImageURL = "https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2"
	DefaultSumsURL  = "https://cloud.debian.org/images/cloud/trixie/latest/SHA512SUMS"
)

// Image names a cloud image and the SHA512SUMS file that vouches for it.
type Image struct {
	URL     string
	SumsURL string
}

// ChecksumError is an image whose sha512 differs from SHA512SUMS.
type ChecksumError struct {
	Name      string
	Want, Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("image %s: sha512 mismatch: SHA512SUMS says %s, got %s", e.Name, e.Want, e.Got)
}

// ExpectedSHA512 finds name's digest in a SHA512SUMS document.
func ExpectedSHA512(sums []byte, name string) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		if strings.TrimPrefix(f[1], "*") != name {
			continue
		}
		if b, err := hex.DecodeString(f[0]); err != nil || len(b) != sha512.Size {
			return "", fmt.Errorf("SHA512SUMS: bad digest for %s", name)
		}
		return strings.ToLower(f[0]), nil
	}
	return "", fmt.Errorf("SHA512SUMS: no entry for %s", name)
}

// maxSums bounds the checksum list.
const maxSums = 1 << 20

func get(ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}

// Fetch makes sure a verified copy of the image is in cacheDir and returns
// its path. A cached copy is verified again against a fresh SHA512SUMS; a
// download is hashed while it is written and only renamed into place when
// it matches.
func (im Image) Fetch(ctx context.Context, c *http.Client, cacheDir string) (string, error) {
	if c == nil {
		c = http.DefaultClient
	}
	name := path.Base(im.URL)
	resp, err := get(ctx, c, im.SumsURL)
	if err != nil {
		return "", fmt.Errorf("fetch checksums: %w", err)
	}
	sums, err := io.ReadAll(io.LimitReader(resp.Body, maxSums))
	resp.Body.Close()
	if err != nil {
		return "", fmt.Errorf("fetch checksums: %w", err)
	}
	want, err := ExpectedSHA512(sums, name)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("image cache: %w", err)
	}
	dst := filepath.Join(cacheDir, name)
	if got, err := fileSHA512(dst); err == nil && got == want {
		return dst, nil
	}
	resp, err = get(ctx, c, im.URL)
	if err != nil {
		return "", fmt.Errorf("fetch image: %w", err)
	}
	defer resp.Body.Close()
	tmp, err := os.CreateTemp(cacheDir, "."+name+".*")
	if err != nil {
		return "", fmt.Errorf("fetch image: %w", err)
	}
	defer os.Remove(tmp.Name())
	h := sha512.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), resp.Body); err != nil {
		tmp.Close()
		return "", fmt.Errorf("fetch image: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("fetch image: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return "", &ChecksumError{Name: name, Want: want, Got: got}
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("fetch image: %w", err)
	}
	return dst, nil
}

func fileSHA512(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
