package deb

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// clusterPveum is a pveum whose tokens live in one directory for every
// node, as user.cfg lives in pmxcfs for the whole cluster: a token is a
// file holding its comment; list, add and remove act on them as
// pve-access-control's token_index, generate_token and remove_token do
// (add fails on a name taken, remove on one that is not).
const clusterPveum = `#!/bin/sh
echo "$*" >> "$PVEUM_LOG"
S=$PVEUM_STATE
case "$*" in
"user token list "*)
	printf '['; sep=
	for f in "$S"/*; do
		[ -e "$f" ] || continue
		printf '%s{"comment":"%s","expire":0,"privsep":1,"tokenid":"%s"}' "$sep" "$(cat "$f")" "$(basename "$f")"; sep=,
	done
	echo ']' ;;
"user token add "*)
	if [ -e "$S/$5" ]; then echo "Token already exists." >&2; exit 255; fi
	printf %s "$9" > "$S/$5"
	echo "{\"full-tokenid\":\"$4!$5\",\"info\":{\"privsep\":\"1\"},\"value\":\"secret-of-$5-$$\"}" ;;
"user token remove "*)
	if [ ! -e "$S/$5" ]; then echo "no such token '$5' for user '$4'" >&2; exit 255; fi
	rm "$S/$5" ;;
*"list --output-format json"*) echo '[]' ;;
esac
`

// clusterNodes runs pve-access-setup as several nodes of one cluster
// would: one token table, a secret file of each node's own.
type clusterNodes struct {
	t                *testing.T
	bin, state, logs string
}

func newClusterNodes(t *testing.T) *clusterNodes {
	dir := t.TempDir()
	c := &clusterNodes{t: t, bin: filepath.Join(dir, "bin"), state: filepath.Join(dir, "tokens"), logs: dir}
	for _, d := range []string{c.bin, c.state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.bin, "pveum"), []byte(clusterPveum), 0o755); err != nil {
		t.Fatal(err)
	}
	return c
}

// run runs the script as host with its own secret file and env; it
// returns the pveum calls, the output and the error.
func (c *clusterNodes) run(host string, env ...string) (calls []string, out string, err error) {
	log := filepath.Join(c.logs, "calls")
	_ = os.Remove(log)
	cmd := exec.Command("sh", "pve-access-setup")
	cmd.Env = append(os.Environ(), append([]string{"PATH=" + c.bin + ":" + os.Getenv("PATH"),
		"PVEUM_LOG=" + log, "PVEUM_STATE=" + c.state, "PVE_INSPECTD_CONFIG=" + filepath.Join(c.logs, "no-config.toml"),
		"PVE_INSPECTD_NODE=" + host, "PVE_INSPECTD_SECRET_FILE=" + c.secretFile(host)}, env...)...)
	b, err := cmd.CombinedOutput()
	lb, _ := os.ReadFile(log)
	return strings.Split(strings.TrimSpace(string(lb)), "\n"), string(b), err
}

func (c *clusterNodes) secretFile(host string) string {
	return filepath.Join(c.logs, "secret-"+strings.SplitN(host, ".", 2)[0])
}

func (c *clusterNodes) secret(host string) string {
	b, _ := os.ReadFile(c.secretFile(host))
	return string(b)
}

func (c *clusterNodes) tokens() []string {
	es, _ := os.ReadDir(c.state)
	var out []string
	for _, e := range es {
		b, _ := os.ReadFile(filepath.Join(c.state, e.Name()))
		out = append(out, e.Name()+"="+string(b))
	}
	return out
}

func removes(calls []string) []string {
	var out []string
	for _, c := range calls {
		if strings.HasPrefix(c, "user token remove") {
			out = append(out, c)
		}
	}
	return out
}

// TestAccessSetupClusterTokens: tokens are cluster-wide, so setting up a
// second node never touches the token the first node's daemon holds: each
// node gets daemon-<node> (its name without the domain, as Proxmox names
// nodes), a token this node has no secret for is replaced only when its
// comment says it is this node's, a name that is another node's is
// refused with nothing removed, an upgrade keeps the token its secret
// file names, and a secret file of one token with PVE_INSPECTD_TOKEN
// naming another is refused.
func TestAccessSetupClusterTokens(t *testing.T) {
	c := newClusterNodes(t)
	calls, out, err := c.run("pve1.lab.example")
	if err != nil {
		t.Fatalf("node 1: %v\n%s", err, out)
	}
	if !slices.Contains(calls, "user token add pve-inspectd@pve daemon-pve1 --privsep 1 --comment pve-inspectd node=pve1 --output-format json") ||
		!slices.Contains(calls, "acl modify /nodes/pve1 --tokens pve-inspectd@pve!daemon-pve1 --roles PVEInspectNode --propagate 0") {
		t.Errorf("node 1 (FQDN host name) calls:\n%s", strings.Join(calls, "\n"))
	}
	first := c.secret("pve1")

	// the second node: a token of its own, node 1's untouched
	calls, out, err = c.run("pve2")
	if err != nil {
		t.Fatalf("node 2: %v\n%s", err, out)
	}
	if r := removes(calls); len(r) > 0 {
		t.Errorf("setting up node 2 removed tokens: %v", r)
	}
	if got := c.tokens(); !slices.Equal(got, []string{"daemon-pve1=pve-inspectd node=pve1", "daemon-pve2=pve-inspectd node=pve2"}) {
		t.Errorf("tokens after node 2: %v", got)
	}
	if c.secret("pve1") != first || !strings.Contains(c.secret("pve2"), `"full-tokenid":"pve-inspectd@pve!daemon-pve2"`) {
		t.Errorf("secrets: node 1 %q (was %q), node 2 %q", c.secret("pve1"), first, c.secret("pve2"))
	}

	// node 3 told to use node 1's token name, with no secret of it: refused, nothing removed
	calls, out, err = c.run("pve3", "PVE_INSPECTD_TOKEN=daemon-pve1")
	if err == nil || !strings.Contains(out, "does not say it is this node's") {
		t.Errorf("node 3 with node 1's token name: err %v, output %q; want a refusal", err, out)
	}
	if r := removes(calls); len(r) > 0 || !slices.Contains(c.tokens(), "daemon-pve1=pve-inspectd node=pve1") {
		t.Errorf("node 3 removed %v; tokens %v", r, c.tokens())
	}
	if _, err := os.Stat(c.secretFile("pve3")); err == nil {
		t.Error("node 3 wrote a secret file")
	}

	// node 1 lost its secret: its own token is replaced, node 2's kept
	if err := os.Remove(c.secretFile("pve1")); err != nil {
		t.Fatal(err)
	}
	calls, out, err = c.run("pve1")
	if err != nil {
		t.Fatalf("node 1 again: %v\n%s", err, out)
	}
	if r := removes(calls); !slices.Equal(r, []string{"user token remove pve-inspectd@pve daemon-pve1"}) {
		t.Errorf("node 1 without its secret removed %v, want its own token only", r)
	}
	if s := c.secret("pve1"); s == "" || s == first {
		t.Errorf("node 1's new secret %q (old %q)", s, first)
	}

	// an upgrade from the single token of earlier versions keeps it
	legacy := `{"full-tokenid":"pve-inspectd@pve!daemon","info":{"privsep":"1"},"value":"old"}`
	if err := os.WriteFile(filepath.Join(c.state, "daemon"), []byte("pve-inspectd"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.secretFile("pve4"), []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	calls, out, err = c.run("pve4")
	if err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	joined := strings.Join(calls, "\n")
	if strings.Contains(joined, "user token add") || strings.Contains(joined, "user token remove") ||
		!slices.Contains(calls, "acl modify /pool/pve-inspect --tokens pve-inspectd@pve!daemon --roles PVEInspect --propagate 1") {
		t.Errorf("upgrade with the old token's secret:\n%s", joined)
	}

	// a secret of one token and PVE_INSPECTD_TOKEN naming another: refused before any call
	calls, out, err = c.run("pve2", "PVE_INSPECTD_TOKEN=other")
	if err == nil || !strings.Contains(out, "holds the secret of token daemon-pve2") || strings.Join(calls, "") != "" {
		t.Errorf("mismatched PVE_INSPECTD_TOKEN: err %v, output %q, calls %v", err, out, calls)
	}
}

// TestAccessSetupRefusesBeforeChanging: what would make the script judge
// a token's owner wrongly, or grant on a path that is no node, stops it
// before its first pveum call, or before it touches any token: a token
// name matched as a pattern (a "." standing for the "-" of another
// node's token), a node name Proxmox would not have, a secret file that
// names no token of the user, one that holds no secret.
func TestAccessSetupRefusesBeforeChanging(t *testing.T) {
	c := newClusterNodes(t)
	if _, out, err := c.run("pvea", "PVE_INSPECTD_TOKEN=sandbox.1"); err != nil {
		t.Fatalf("node a: %v\n%s", err, out)
	}
	if _, out, err := c.run("pveb", "PVE_INSPECTD_TOKEN=sandbox-1"); err != nil {
		t.Fatalf("node b: %v\n%s", err, out)
	}
	// node c (no secret) asked for sandbox.1: a's, not c's
	_ = os.Remove(c.secretFile("pvec"))
	calls, out, err := c.run("pvec", "PVE_INSPECTD_TOKEN=sandbox.1")
	if err == nil || len(removes(calls)) > 0 {
		t.Errorf("node c took node a's token: err %v, removes %v\n%s", err, removes(calls), out)
	}
	// node b without its secret, asked for sandbox.1: still a's
	if err := os.Remove(c.secretFile("pveb")); err != nil {
		t.Fatal(err)
	}
	calls, out, err = c.run("pveb", "PVE_INSPECTD_TOKEN=sandbox.1")
	if err == nil || len(removes(calls)) > 0 {
		t.Errorf("node b took node a's token by a pattern: err %v, removes %v\n%s", err, removes(calls), out)
	}
	if got := c.tokens(); !slices.Equal(got, []string{"sandbox-1=pve-inspectd node=pveb", "sandbox.1=pve-inspectd node=pvea"}) {
		t.Errorf("tokens: %v", got)
	}

	for name, tc := range map[string]struct {
		host, secret, want string
		env                []string
	}{
		"empty node name":           {host: ".example.org", want: "node name"},
		"node name with a slash":    {host: "a/b", want: "node name"},
		"node name ending in -":     {host: "pve-", want: "node name"},
		"plain secret, no name":     {host: "pved", secret: "abc-123", want: "does not say which token"},
		"another user's token":      {host: "pved", secret: `{"full-tokenid":"root@pam!x","value":"s"}`, want: "does not say which token"},
		"JSON without a secret":     {host: "pved", secret: `{"full-tokenid":"pve-inspectd@pve!daemon-pved"}`, want: "holds no secret"},
		"JSON with an empty secret": {host: "pved", secret: `{"full-tokenid":"pve-inspectd@pve!daemon-pved","value":""}`, want: "holds no secret"},
	} {
		if tc.secret != "" {
			if err := os.WriteFile(c.secretFile(tc.host), []byte(tc.secret), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		calls, out, err := c.run(tc.host, tc.env...)
		if err == nil || !strings.Contains(out, tc.want) || strings.Join(calls, "") != "" {
			t.Errorf("%s: err %v, output %q, calls %v; want a refusal with %q and no pveum call", name, err, out, calls, tc.want)
		}
		_ = os.Remove(c.secretFile(tc.host))
	}
	// a plain secret with its token named is taken as that token's
	if err := os.WriteFile(c.secretFile("pved"), []byte("abc-123"), 0o600); err != nil {
		t.Fatal(err)
	}
	calls, out, err = c.run("pved", "PVE_INSPECTD_TOKEN=hand-made")
	if err != nil || strings.Contains(strings.Join(calls, "\n"), "user token") {
		t.Errorf("plain secret with PVE_INSPECTD_TOKEN: err %v, calls %v\n%s", err, calls, out)
	}
}
