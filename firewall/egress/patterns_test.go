package egress

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// entryTable is a table of allow and deny entries of every kind, each
// accepted or refused by Compile, for tests that hold a statement of the
// rules (EntryPatterns, the OpenAPI document) to Compile.
func entryTable() []string {
	long := strings.Repeat("a", 63)
	name253 := strings.Join([]string{long, long, long, strings.Repeat("b", 59)}, ".") // 253
	out := []string{
		"", ".", "*", "*.", "a", "a.", "*.org", "localhost",
		"pypi.org", "PyPI.ORG.", "files.pypi.org", "*.github.com", "*.github.com.", "a.*.org", "**.a.org", "*.*.a.org",
		"py pi.org", "pypi..org", "pypi.org..", ".pypi.org", "a_b.c-d.org", "a.b-", "a.-b", "a._b", "a.b_",
		"xn--bcher-kva.example", "a.1org", "a.org1", "0.org", "\u212a.org", "k.org", "é.org", "a.org\x00",
		long + ".org", long + "a.org", "a." + long, "a." + long + "b", name253, name253 + ".", "*." + name253, name253[:250] + ":22",
		"github.com:22", "*.example.org:8443", "github.com.:22", "github.com:443", "github.com:80", "github.com:0",
		"github.com:0443", "github.com:0080", "github.com:022", "github.com:65535", "github.com:65536", "github.com:+22",
		"github.com:ssh", "github.com:", "github.com:22:22", ":22", "*:22", "github:22",
		"203.0.113.7", "203.0.113.7:22", "203.0.113.07", "203.0.113.256", "1.2.3", "1.2.3.4.5", "01.2.3.4", " 1.2.3.4",
		"2001:db8::1", "::1", "::ffff:1.2.3.4", "fe80::1%eth0", "1::2:22",
		"198.51.100.0/24", "203.0.113.7/24", "203.0.113.0/33", "0.0.0.0/0", "1.0.0.0/0", "10.0.0.0/8", "10.128.0.0/9",
		"10.64.0.0/9", "255.255.255.255/32", "255.255.255.254/31", "255.255.255.255/31", "10.0.0.0/08", "10.0.0.0/+8",
		"10.0.0.0/", "/8", "10.0.0.0/8/8", "2001:db8::/32", "::ffff:10.0.0.0/104", "10.0.0.0/24:22",
	}
	for p := 0; p <= 70000; p += 7 {
		out = append(out, "a.org:"+strconv.Itoa(p))
	}
	for bits := 0; bits <= 33; bits++ {
		out = append(out, "10.128.64.0/"+strconv.Itoa(bits), "192.168.255.252/"+strconv.Itoa(bits))
	}
	r := rand.New(rand.NewPCG(26, 26))
	chars := []rune("ab09.:/*-_Z \u212a")
	for range 20000 {
		var b strings.Builder
		for range r.IntN(16) {
			b.WriteRune(chars[r.IntN(len(chars))])
		}
		out = append(out, b.String())
	}
	return out
}

// compileAccepts reports whether Compile takes e as the only allow entry
// (mode allowlist) or the only deny entry.
func compileAccepts(e string, deny bool) bool {
	p := Policy{Mode: "allowlist", Allow: []string{e}}
	if deny {
		p = Policy{Mode: "open", Deny: []string{e}}
	}
	_, err := Compile(p)
	return err == nil
}

// TestEntryPatterns: AllowEntryPattern and DenyEntryPattern, with
// MaxEntryChars, match exactly the entries Compile takes.
func TestEntryPatterns(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pattern string
		deny    bool
		min     int // accepted entries of the table at least
	}{{"allow", AllowEntryPattern(), false, 9000}, {"deny", DenyEntryPattern(), true, 20}} {
		re := regexp.MustCompile(tc.pattern)
		accepted := 0
		for _, e := range entryTable() {
			want := compileAccepts(e, tc.deny)
			if want {
				accepted++
			}
			if got := len(e) <= MaxEntryChars && re.MatchString(e); got != want {
				t.Errorf("%s entry %q: pattern says %v, Compile %v", tc.name, e, got, want)
			}
		}
		if accepted < tc.min {
			t.Errorf("%s: only %d entries of the table accepted", tc.name, accepted)
		}
	}
}

// TestParseDomainTightened: a name whose last label starts with a digit
// (a mistyped address) and a name with a letter that only lowers to ASCII
// are refused; an entry past MaxEntryChars is.
func TestParseDomainTightened(t *testing.T) {
	for _, e := range []string{"10.0.0.256", "010.0.0.1", "a.1org", "\u212a.org", strings.Repeat("a.", 126) + "org"} {
		if compileAccepts(e, false) {
			t.Errorf("allow entry %q accepted", e)
		}
	}
	for _, e := range []string{"a.org1", "k.org", strings.Repeat("a.", 125) + "org"} {
		if !compileAccepts(e, false) {
			t.Errorf("allow entry %q refused", e)
		}
	}
}
