// Package auth stores the sandbox API's bearer tokens, hashed, in a token
// file, and verifies them. A token is "pvei_<id>_<secret>": the id (8 hex
// digits) finds the entry, the file keeps only the SHA-256 of the whole token
// (the secret has 256 bits of entropy, so a plain hash is enough) and the
// comparison is constant-time. The file is re-read when it changes, so
// `pve-inspectd token revoke` takes effect without a restart.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
)

// Scopes a token can carry (admin > exec > read).
var Scopes = []string{"read", "exec", "admin"}

// ErrInvalid is returned for a token that is malformed, unknown or revoked.
var ErrInvalid = errors.New("invalid token")

// Token is one stored token (never its secret).
type Token struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Scopes  []string  `json:"scopes"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
	// Owner, when set, binds the token to that owner: it sees and touches
	// only the sandboxes of that owner, and creates sandboxes for it.
	Owner string `json:"owner,omitempty"`
}

type file struct {
	Tokens []Token `json:"tokens"`
}

// Store is a token file.
type Store struct {
	path string

	mu    sync.Mutex
	stamp time.Time
	size  int64
	toks  map[string]Token
	err   error
}

// Open returns the store at path; a missing file is an empty store.
func Open(path string) *Store { return &Store{path: path} }

var (
	reToken = regexp.MustCompile(`^pvei_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$`)
	reName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// ValidName reports whether s is a well-formed token name or owner.
func ValidName(s string) bool { return reName.MatchString(s) }

// load re-reads the file when its mtime or size changed.
func (s *Store) load() (map[string]Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fi, err := os.Stat(s.path)
	if errors.Is(err, os.ErrNotExist) {
		s.toks, s.err, s.stamp, s.size = map[string]Token{}, nil, time.Time{}, -1
		return s.toks, nil
	}
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if s.toks != nil && fi.ModTime().Equal(s.stamp) && fi.Size() == s.size {
		return s.toks, s.err
	}
	f, err := readFile(s.path)
	if err != nil {
		s.toks, s.err = map[string]Token{}, err
	} else {
		s.toks, s.err = map[string]Token{}, nil
		for _, t := range f.Tokens {
			s.toks[t.ID] = t
		}
	}
	s.stamp, s.size = fi.ModTime(), fi.Size()
	return s.toks, s.err
}

func readFile(path string) (file, error) {
	var f file
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("token file: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("token file %s: %w", path, err)
	}
	return f, nil
}

// Verify checks a presented token and returns its name and scopes.
func (s *Store) Verify(token string) (string, []string, error) {
	name, scopes, _, err := s.VerifyOwner(token)
	return name, scopes, err
}

// VerifyOwner is Verify that also returns the owner the token is bound to
// ("" when it is not).
func (s *Store) VerifyOwner(token string) (string, []string, string, error) {
	toks, err := s.load()
	if err != nil {
		return "", nil, "", err
	}
	m := reToken.FindStringSubmatch(token)
	sum := sha256.Sum256([]byte(token))
	var t Token
	ok := false
	if m != nil {
		t, ok = toks[m[1]]
	}
	want, derr := hex.DecodeString(t.SHA256)
	if !ok || derr != nil || len(want) != sha256.Size {
		want = make([]byte, sha256.Size)
		ok = false
	}
	if subtle.ConstantTimeCompare(sum[:], want) != 1 || !ok {
		return "", nil, "", ErrInvalid
	}
	return t.Name, slices.Clone(t.Scopes), t.Owner, nil
}

// withLock runs fn with an exclusive lock on <path>.lock, then writes the
// file fn returns atomically (mode 0600).
func (s *Store) update(fn func(*file) error) error {
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	lf, err := os.OpenFile(s.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("token file lock: %w", err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("token file lock: %w", err)
	}
	f, err := readFile(s.path)
	if err != nil {
		return err
	}
	if err := fn(&f); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	return nil
}

// Create adds a token and returns its secret form (shown once).
func (s *Store) Create(name string, scopes []string, now time.Time) (string, Token, error) {
	return s.CreateOwned(name, "", scopes, now)
}

// CreateOwned is Create for a token bound to owner ("" = unbound).
func (s *Store) CreateOwned(name, owner string, scopes []string, now time.Time) (string, Token, error) {
	if !reName.MatchString(name) {
		return "", Token{}, fmt.Errorf("token name %q: want [A-Za-z0-9._-], at most 64 characters", name)
	}
	if owner != "" && !reName.MatchString(owner) {
		return "", Token{}, fmt.Errorf("owner %q: want [A-Za-z0-9._-], at most 64 characters", owner)
	}
	if len(scopes) == 0 {
		return "", Token{}, errors.New("at least one scope is required (read, exec, admin)")
	}
	for _, sc := range scopes {
		if !slices.Contains(Scopes, sc) {
			return "", Token{}, fmt.Errorf("unknown scope %q (want read, exec or admin)", sc)
		}
	}
	var idb [4]byte
	var sec [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", Token{}, err
	}
	if _, err := rand.Read(sec[:]); err != nil {
		return "", Token{}, err
	}
	id := hex.EncodeToString(idb[:])
	tok := "pvei_" + id + "_" + base64.RawURLEncoding.EncodeToString(sec[:])
	sum := sha256.Sum256([]byte(tok))
	t := Token{ID: id, Name: name, Scopes: slices.Clone(scopes), SHA256: hex.EncodeToString(sum[:]), Created: now.UTC(), Owner: owner}
	err := s.update(func(f *file) error {
		for _, o := range f.Tokens {
			if o.Name == name {
				return fmt.Errorf("a token named %q exists; revoke it first", name)
			}
			if o.ID == id {
				return errors.New("token id collision; try again")
			}
		}
		f.Tokens = append(f.Tokens, t)
		return nil
	})
	if err != nil {
		return "", Token{}, err
	}
	return tok, t, nil
}

// List returns the stored tokens.
func (s *Store) List() ([]Token, error) {
	f, err := readFile(s.path)
	if err != nil {
		return nil, err
	}
	return f.Tokens, nil
}

// Revoke removes the token with this id or name.
func (s *Store) Revoke(idOrName string) error {
	return s.update(func(f *file) error {
		n := len(f.Tokens)
		f.Tokens = slices.DeleteFunc(f.Tokens, func(t Token) bool {
			return t.ID == idOrName || t.Name == idOrName || strings.HasPrefix(idOrName, "pvei_"+t.ID+"_")
		})
		if len(f.Tokens) == n {
			return fmt.Errorf("no token %q", idOrName)
		}
		return nil
	})
}
