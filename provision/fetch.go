package provision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// Fetcher gets a file from a local path or an http(s) URL and returns its
// content only when its sha256 matches.
type Fetcher interface {
	Fetch(ctx context.Context, src, sha256hex string) ([]byte, error)
}

// ChecksumError reports content whose digest differs from the expected one.
type ChecksumError struct {
	Source    string
	Want      string
	Got       string
	Algorithm string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("%s: %s mismatch: want %s, got %s", e.Source, e.Algorithm, e.Want, e.Got)
}

// maxFetch bounds a download (a .deb or a keyring, never an image).
const maxFetch = 512 << 20

// HTTPFetcher fetches paths from the machine's file system and URLs over
// HTTP(S).
type HTTPFetcher struct {
	Client *http.Client
	// Root maps local paths (tests).
	Root Root
}

// Fetch implements Fetcher.
func (f HTTPFetcher) Fetch(ctx context.Context, src, want string) ([]byte, error) {
	if err := validSHA256(want); err != nil {
		return nil, fmt.Errorf("fetch %s: %w", src, err)
	}
	var data []byte
	u, err := url.Parse(src)
	switch {
	case err == nil && (u.Scheme == "http" || u.Scheme == "https"):
		c := f.Client
		if c == nil {
			c = http.DefaultClient
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", src, err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", src, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("fetch %s: %s", src, resp.Status)
		}
		data, err = io.ReadAll(io.LimitReader(resp.Body, maxFetch+1))
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", src, err)
		}
		if len(data) > maxFetch {
			return nil, fmt.Errorf("fetch %s: larger than %d bytes", src, maxFetch)
		}
	case err == nil && u.Scheme == "file":
		data, err = os.ReadFile(f.Root.Path(u.Path))
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", src, err)
		}
	case strings.HasPrefix(src, "/"):
		data, err = os.ReadFile(f.Root.Path(src))
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w", src, err)
		}
	default:
		return nil, fmt.Errorf("fetch %s: not an absolute path or an http(s)/file URL", src)
	}
	if got := SHA256Hex(data); got != want {
		return nil, &ChecksumError{Source: src, Want: want, Got: got, Algorithm: "sha256"}
	}
	return data, nil
}

// SHA256Hex returns the lowercase hex sha256 of b.
func SHA256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func validSHA256(s string) error {
	if len(s) != 64 {
		return fmt.Errorf("sha256 %q: want 64 hex digits", s)
	}
	if _, err := hex.DecodeString(s); err != nil || strings.ToLower(s) != s {
		return fmt.Errorf("sha256 %q: want lowercase hex", s)
	}
	return nil
}
