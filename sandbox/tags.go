package sandbox

import (
	"crypto/rand"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// reSandbox is the form of a sandbox id (newSandboxID).
var reSandbox = regexp.MustCompile(`^sb[a-z0-9]{6}$`)

// ValidID reports whether id has the form of a sandbox id ("sb" and six
// lowercase letters or digits).
func ValidID(id string) bool { return reSandbox.MatchString(id) }

// nodeTag and sandboxTag are the ownership tags (Proxmox pve-tag format).
func nodeTag(node string) string { return "pvei-n-" + sanitizeTag(node) }

func sandboxTag(id string) string { return "pvei-s-" + id }

func sanitizeTag(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	return string(b)
}

// ownedBy reports whether tags carry this node's tag and the sandbox's tag,
// returning the sandbox id.
func (m *Engine) ownedBy(tags []string) (string, bool) {
	nt := nodeTag(m.o.Node)
	if !slices.Contains(tags, nt) {
		return "", false
	}
	for _, t := range tags {
		if id, ok := strings.CutPrefix(t, "pvei-s-"); ok && reSandbox.MatchString(id) {
			return id, true
		}
	}
	return "", false
}

// aliasTags splits a vnet alias into its tags.
func aliasTags(alias string) []string { return strings.Fields(alias) }

func (m *Engine) vmName(sb, vm string) string { return "pvei-" + sb + "-" + vm }

func newSandboxID() string {
	const alpha = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [6]byte
	_, _ = rand.Read(b[:])
	out := []byte("sb")
	for _, c := range b {
		out = append(out, alpha[int(c)%len(alpha)])
	}
	return string(out)
}

// vnetID derives the i-th vnet id (8 characters, Proxmox's limit) from the
// sandbox id.
func vnetID(sb string, i int) string { return "v" + sb[2:] + strconv.Itoa(i) }
