package sandboxapi

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// createAccepts runs the create validator on a valid request changed by mod.
func createAccepts(mod func(*apitype.CreateRequest)) bool {
	c := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}
	mod(&c)
	return validateCreate(&c, 3600, 86400) == nil
}

// rule returns the keywords the document gives prop.
func rule(t *testing.T, prop string) map[string]any {
	t.Helper()
	kw, ok := (&Server{}).createRules()[prop]
	if !ok {
		t.Fatalf("no rule for %s", prop)
	}
	return kw
}

// sub is the part of the keywords kw that rules a kind of value: "" kw
// itself; "keys" and "values" an object's keys (as a pattern) and values
// (its one patternProperties entry, keyedBy); else the keyword of that name.
func sub(t *testing.T, kw map[string]any, part string) map[string]any {
	t.Helper()
	switch part {
	case "":
		return kw
	case "keys", "values":
		pp, _ := kw["patternProperties"].(map[string]any)
		if len(pp) != 1 || kw["additionalProperties"] != false {
			t.Fatalf("want one patternProperties entry and additionalProperties false: %v", kw)
		}
		for k, v := range pp {
			if part == "keys" {
				return map[string]any{"pattern": k}
			}
			return v.(map[string]any)
		}
	}
	return kw[part].(map[string]any)
}

// randomStrings are fuzz candidates over the characters of alphabet,
// lengths 0..maxLen, and extra. (JSON carries only valid UTF-8: the
// decoder replaces anything else, so candidates are characters.)
func randomStrings(seed uint64, alphabet string, maxLen int, extra ...string) []string {
	r := rand.New(rand.NewPCG(seed, 26))
	chars := []rune(alphabet)
	out := append([]string{}, extra...)
	for range 4000 {
		var b strings.Builder
		for range r.IntN(maxLen + 1) {
			b.WriteRune(chars[r.IntN(len(chars))])
		}
		out = append(out, b.String())
	}
	return out
}

// TestOpenAPICreatePatterns: every string pattern of the document matches
// exactly the values the create validator accepts (schemathesis ST202: a
// body the schema allowed was refused).
func TestOpenAPICreatePatterns(t *testing.T) {
	names := randomStrings(1, "abz09-_.A/", 36, "a", "a-", "-a", strings.Repeat("a", 32), strings.Repeat("a", 33), "localhost", "ip6-allnodes", "localhost1")
	tests := []struct {
		prop, pattern string
		cands         []string
		accepts       func(string) bool
	}{
		{"VMRequest.name", "", names, func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) { c.VMs[0].Name = s })
		}},
		{"VMRequest.template", "", randomStrings(2, "aZ9._-/ ", 66, strings.Repeat("a", 63), strings.Repeat("a", 64), ".a"), func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) { c.VMs[0].Template = s })
		}},
		{"NetworkRequest.name", "", names, func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) {
				c.Networks = []apitype.NetworkRequest{{Name: s}}
				c.VMs[0].Networks = []string{s}
			})
		}},
		{"VMRequest.networks", "items", names, func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) {
				c.Networks = []apitype.NetworkRequest{{Name: s}}
				c.VMs[0].Networks = []string{s}
			})
		}},
		{"CreateRequest.labels", "keys", randomStrings(3, "aZ9._/-:", 66, strings.Repeat("a", 63), strings.Repeat("a", 64)), func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) { c.Labels = map[string]string{s: "v"} })
		}},
		{"CreateRequest.env", "keys", randomStrings(4, "aZ9_-=", 8, "_", "9a", "a9"), func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) { c.Env = map[string]string{s: "v"} })
		}},
		{"CreateRequest.owner", "", randomStrings(5, "a \x01\x7fé", 70, strings.Repeat("é", 64), strings.Repeat("é", 65)), func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) { c.Owner = s })
		}},
		{"CreateRequest.labels", "values", randomStrings(6, "a \x1f\x7fé", 260, strings.Repeat("é", 256), strings.Repeat("é", 257)), func(s string) bool {
			return createAccepts(func(c *apitype.CreateRequest) { c.Labels = map[string]string{"k": s} })
		}},
	}
	for _, tc := range tests {
		kw := sub(t, rule(t, tc.prop), tc.pattern)
		re := regexp.MustCompile(kw["pattern"].(string))
		maxLen, _ := kw["maxLength"].(int)
		for _, s := range tc.cands {
			allowed := re.MatchString(s) && (maxLen == 0 || len([]rune(s)) <= maxLen) && !notEnum(kw, s)
			if got := tc.accepts(s); got != allowed {
				t.Errorf("%s %s %q: the document allows it %v, the validator accepts it %v", tc.prop, tc.pattern, s, allowed, got)
			}
		}
	}
}

// notEnum reports whether kw's "not": {"enum": [...]} names s.
func notEnum(kw map[string]any, s string) bool {
	not, _ := kw["not"].(map[string]any)
	enum, _ := not["enum"].([]string)
	return slices.Contains(enum, s)
}

// TestOpenAPICreateCIDRPattern: the CIDR pattern built from the private
// ranges and prefix bounds is the validator's rule, every prefix length
// and host-bit case.
func TestOpenAPICreateCIDRPattern(t *testing.T) {
	re := regexp.MustCompile(rule(t, "NetworkRequest.cidr")["pattern"].(string))
	cands := []string{"", "auto", "Auto", " 10.0.0.0/16", "10.0.0.0/16 ", "010.0.0.0/16", "10.0.0.0/016", "10.00.0.0/16",
		"10.0.0.0", "10.0.0.0/", "::/16", "fd00::/16", "10.256.0.0/16"}
	for _, a := range []string{"10.0", "10.255", "10.7", "172.15", "172.16", "172.31", "172.32", "192.168", "192.169", "11.0", "0.0"} {
		for _, c := range []int{0, 1, 8, 16, 17, 64, 128, 200, 240, 255} {
			for _, d := range []int{0, 1, 16, 64, 128, 240, 255} {
				for bits := 8; bits <= 32; bits++ {
					cands = append(cands, fmt.Sprintf("%s.%d.%d/%d", a, c, d, bits))
				}
			}
		}
	}
	accepted := 0
	for _, s := range cands {
		got := createAccepts(func(c *apitype.CreateRequest) { c.Networks = []apitype.NetworkRequest{{Name: "net0", CIDR: s}} })
		if allowed := re.MatchString(s); got != allowed {
			t.Errorf("cidr %q: the document allows it %v, the validator accepts it %v", s, allowed, got)
		}
		if got {
			accepted++
		}
	}
	if accepted < 100 {
		t.Errorf("only %d of %d candidate CIDRs accepted: the candidates miss the valid ones", accepted, len(cands))
	}
}

// TestOpenAPICreateBounds: every numeric and count bound of the document
// is exact: at the bound accepted, one past refused.
func TestOpenAPICreateBounds(t *testing.T) {
	vms := func(n int) func(*apitype.CreateRequest) {
		return func(c *apitype.CreateRequest) {
			c.VMs = nil
			for i := range n {
				c.VMs = append(c.VMs, apitype.VMRequest{Template: "debian", Name: fmt.Sprintf("v%d", i)})
			}
		}
	}
	nets := func(n int) func(*apitype.CreateRequest) {
		return func(c *apitype.CreateRequest) {
			for i := range n {
				c.Networks = append(c.Networks, apitype.NetworkRequest{Name: fmt.Sprintf("n%d", i)})
			}
		}
	}
	vmNets := func(n int) func(*apitype.CreateRequest) {
		return func(c *apitype.CreateRequest) {
			c.VMs[0].Networks = make([]string, n)
			for i := range c.VMs[0].Networks {
				c.VMs[0].Networks[i] = "net0"
			}
		}
	}
	labels := func(n int) func(*apitype.CreateRequest) {
		return func(c *apitype.CreateRequest) {
			c.Labels = map[string]string{}
			for i := range n {
				c.Labels[fmt.Sprintf("k%d", i)] = "v"
			}
		}
	}
	env := func(n int) func(*apitype.CreateRequest) {
		return func(c *apitype.CreateRequest) {
			c.Env = map[string]string{}
			for i := range n {
				c.Env[fmt.Sprintf("K%d", i)] = "v"
			}
		}
	}
	num := func(set func(*apitype.VMRequest, int)) func(int) func(*apitype.CreateRequest) {
		return func(n int) func(*apitype.CreateRequest) {
			return func(c *apitype.CreateRequest) { set(&c.VMs[0], n) }
		}
	}
	cores := num(func(v *apitype.VMRequest, n int) { v.Cores = n })
	disk := num(func(v *apitype.VMRequest, n int) { v.DiskGiB = n })
	mem := num(func(v *apitype.VMRequest, n int) { v.MemoryMiB = n })
	for _, tc := range []struct {
		prop, min, max string
		set            func(int) func(*apitype.CreateRequest)
	}{
		{"CreateRequest.vms", "minItems", "maxItems", vms},
		{"CreateRequest.networks", "", "maxItems", nets},
		{"VMRequest.networks", "", "maxItems", vmNets},
		{"CreateRequest.labels", "", "maxProperties", labels},
		{"CreateRequest.env", "", "maxProperties", env},
		{"VMRequest.cores", "minimum", "maximum", cores},
		{"VMRequest.disk_gib", "minimum", "maximum", disk},
	} {
		kw := rule(t, tc.prop)
		if tc.min != "" {
			lo := kw[tc.min].(int)
			if !createAccepts(tc.set(lo)) || (lo > 0 && createAccepts(tc.set(lo-1))) || (lo == 0 && createAccepts(tc.set(-1))) {
				t.Errorf("%s %s %d is not the validator's bound", tc.prop, tc.min, lo)
			}
		}
		hi := kw[tc.max].(int)
		if !createAccepts(tc.set(hi)) || createAccepts(tc.set(hi+1)) {
			t.Errorf("%s %s %d is not the validator's bound", tc.prop, tc.max, hi)
		}
	}
	// memory: 0 (the default) or minimum..maximum
	alts := rule(t, "VMRequest.memory_mib")["anyOf"].([]any)
	zero, rng := alts[0].(map[string]any), alts[1].(map[string]any)
	lo, hi := rng["minimum"].(int), rng["maximum"].(int)
	if zero["enum"].([]int)[0] != 0 || !createAccepts(mem(0)) || !createAccepts(mem(lo)) || !createAccepts(mem(hi)) ||
		createAccepts(mem(lo-1)) || createAccepts(mem(1)) || createAccepts(mem(hi+1)) || createAccepts(mem(-1)) {
		t.Errorf("memory_mib %v: not the validator's bounds", alts)
	}
}

// TestOpenAPIExecAndParamPatterns: the exec body's and the file and
// snapshot parameters' patterns match exactly what their validators
// accept; the exec bounds are exact.
func TestOpenAPIExecAndParamPatterns(t *testing.T) {
	execAccepts := func(mod func(*apitype.ExecRequest)) bool {
		e := apitype.ExecRequest{Argv: []string{"true"}}
		mod(&e)
		return validateExec(&e, false) == nil
	}
	kw := func(prop, part string) map[string]any { return sub(t, rule(t, prop), part) }
	paths := randomStrings(7, "/a\x00é.", 12, "", "/", "a/", strings.Repeat("/", maxPathLen), strings.Repeat("/", maxPathLen+1))
	tests := []struct {
		name    string
		kw      map[string]any
		cands   []string
		accepts func(string) bool
	}{
		{"argv items", kw("ExecRequest.argv", "items"), randomStrings(8, "a\x00 ", 4), func(s string) bool {
			return execAccepts(func(e *apitype.ExecRequest) { e.Argv = []string{"true", s} })
		}},
		{"cwd", kw("ExecRequest.cwd", ""), paths, func(s string) bool {
			return execAccepts(func(e *apitype.ExecRequest) { e.Cwd = s })
		}},
		{"env names", kw("ExecRequest.env", "keys"), randomStrings(9, "a=\x00_", 4), func(s string) bool {
			return execAccepts(func(e *apitype.ExecRequest) { e.Env = map[string]string{s: "v"} })
		}},
		{"env values", kw("ExecRequest.env", "values"), randomStrings(10, "a=\x00 ", 4), func(s string) bool {
			return execAccepts(func(e *apitype.ExecRequest) { e.Env = map[string]string{"K": s} })
		}},
		{"user", kw("ExecRequest.user", ""), randomStrings(11, "a :/\x01é", 70, strings.Repeat("é", 64), strings.Repeat("é", 65)), func(s string) bool {
			return execAccepts(func(e *apitype.ExecRequest) { e.User = s })
		}},
		{"path", pathRule(), paths, func(s string) bool { return validateGuestPath(s) == nil }},
		{"mode", modeRule(), randomStrings(12, "0178+-_x", 6, "", "0", "777", "0777", "1000", "00000000000644"), func(s string) bool {
			_, pr := parseMode(s)
			return pr == nil
		}},
		{"snapshot", snapshotRule(), randomStrings(13, "aZ9_-é ", 42, strings.Repeat("a", 40), strings.Repeat("a", 41), "current", "Current", "currentx"), func(s string) bool {
			return validateSnapshotName(s) == nil
		}},
	}
	for _, tc := range tests {
		re := regexp.MustCompile(tc.kw["pattern"].(string))
		maxLen, _ := tc.kw["maxLength"].(int)
		minLen, _ := tc.kw["minLength"].(int)
		for _, s := range tc.cands {
			n := len([]rune(s))
			allowed := re.MatchString(s) && (maxLen == 0 || n <= maxLen) && n >= minLen
			if not, ok := tc.kw["not"].(map[string]any); ok && slices.Contains(not["enum"].([]string), s) {
				allowed = false
			}
			if got := tc.accepts(s); got != allowed {
				t.Errorf("%s %q: the document allows it %v, the validator accepts it %v", tc.name, s, allowed, got)
			}
		}
	}
	for _, tc := range []struct {
		prop, min, max string
		set            func(int) func(*apitype.ExecRequest)
	}{
		{"ExecRequest.argv", "minItems", "maxItems", func(n int) func(*apitype.ExecRequest) {
			return func(e *apitype.ExecRequest) { e.Argv = slicesRepeat("a", n) }
		}},
		{"ExecRequest.timeout_seconds", "minimum", "maximum", func(n int) func(*apitype.ExecRequest) {
			return func(e *apitype.ExecRequest) { e.TimeoutSeconds = int64(n) }
		}},
		{"ExecRequest.output_limit", "minimum", "maximum", func(n int) func(*apitype.ExecRequest) {
			return func(e *apitype.ExecRequest) { e.OutputLimit = int64(n) }
		}},
	} {
		k := rule(t, tc.prop)
		lo, hi := k[tc.min].(int), k[tc.max].(int)
		if !execAccepts(tc.set(lo)) || execAccepts(tc.set(lo-1)) || !execAccepts(tc.set(hi)) || execAccepts(tc.set(hi+1)) {
			t.Errorf("%s %d..%d is not the validator's bound", tc.prop, lo, hi)
		}
	}
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, max(n, 0))
	for i := range out {
		out[i] = s
	}
	return out
}

// TestDecodeRefusesNull: a null anywhere in a body is refused (schemathesis
// ST201 on check: {"vm": null} was taken as no VM given); null inside a
// string is text.
func TestDecodeRefusesNull(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"vm": null}`, false},
		{`{"vm": "a"}`, true},
		{`{"vm": "null"}`, true},
		{`{}`, true},
	} {
		var req apitype.CheckRequest
		if pr := decodeStrict(strings.NewReader(tc.body), 1<<10, &req); (pr == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.body, pr, tc.ok)
		}
	}
	var c apitype.CreateRequest
	if pr := decodeStrict(strings.NewReader(`{"vms":[{"template":"debian","networks":null}]}`), 1<<10, &c); pr == nil {
		t.Error("a nested null accepted")
	}
}
