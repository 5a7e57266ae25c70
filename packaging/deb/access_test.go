package deb

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// fakeTemplates are the templates the fake qm of writeFakePVE knows, by
// VMID (their NICs: on host bridges, a VLAN, trunks, and an SDN vnet of
// fakeVNets).
var fakeTemplates = map[int]map[string]string{
	9000: {"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1", "net1": "virtio=BC:24:11:00:00:02,bridge=tplnet"},
	9001: {"net0": "e1000=BC:24:11:00:00:03,bridge=vmbr1,tag=5", "net1": "virtio=BC:24:11:00:00:04,bridge=vmbr2,trunks=10;20-21"},
}

// fakeCTTemplates are the container templates the fake pct of
// writeFakePVE knows (the fake qm does not: a CT's id has no qemu-server
// config).
var fakeCTTemplates = map[int]map[string]string{
	9100: {"net0": "name=eth0,bridge=vmbr3,hwaddr=BC:24:11:00:00:05,ip=dhcp,type=veth", "net1": "name=eth1,bridge=vmbr4,tag=7,type=veth"},
}

// fakeVNets are the SDN vnets (vnet: zone) the fake pvesh lists.
var fakeVNets = map[string]string{"tplnet": "tplz"}

// fakeBridges are the host bridge paths of templates as pveapi/access
// computes them (what the script must grant).
func fakeBridges(ids ...int) []string {
	var confs []map[string]string
	for _, id := range ids {
		if c, ok := fakeTemplates[id]; ok {
			confs = append(confs, c)
		} else {
			confs = append(confs, fakeCTTemplates[id])
		}
	}
	local, _ := access.TemplateBridges(confs, func(b string) string { return fakeVNets[b] })
	return local
}

// writeFakePVE writes a qm that prints fakeTemplates' configs (`qm config
// ID --current 1`; an unknown ID fails as qm does), a pct that prints
// fakeCTTemplates' the same way and a pvesh that lists fakeVNets into dir.
func writeFakePVE(t *testing.T, dir string) {
	t.Helper()
	fakeConfig := func(cmd, confDir, disk string, templates map[int]map[string]string) string {
		out := "#!/bin/sh\n[ \"$1 $3 $4\" = \"config --current 1\" ] || { echo \"fake " + cmd + ": $*\" >&2; exit 9; }\ncase $2 in\n"
		for _, id := range slices.Sorted(maps.Keys(templates)) {
			out += fmt.Sprintf("%d) cat <<'EOF'\nname: t%d\n", id, id)
			for _, k := range slices.Sorted(maps.Keys(templates[id])) {
				out += k + ": " + templates[id][k] + "\n"
			}
			out += fmt.Sprintf(disk+"\ntemplate: 1\nEOF\n;;\n", id)
		}
		return out + "*) echo \"Configuration file 'nodes/pve/" + confDir + "/$2.conf' does not exist\" >&2; exit 2 ;;\nesac\n"
	}
	qm := fakeConfig("qm", "qemu-server", "scsi0: local-lvm:base-%d-disk-0,size=8G", fakeTemplates)
	pct := fakeConfig("pct", "lxc", "rootfs: local-lvm:base-%d-disk-0,size=8G\nunprivileged: 1", fakeCTTemplates)
	var vnets []string
	for _, v := range slices.Sorted(maps.Keys(fakeVNets)) {
		vnets = append(vnets, fmt.Sprintf(`{"digest":"d","type":"vnet","vnet":"%s","zone":"%s"}`, v, fakeVNets[v]))
	}
	pvesh := "#!/bin/sh\n[ \"$*\" = \"get /cluster/sdn/vnets --output-format json\" ] || { echo \"fake pvesh: $*\" >&2; exit 9; }\necho '[" + strings.Join(vnets, ",") + "]'\n"
	for name, body := range map[string]string{"qm": qm, "pct": pct, "pvesh": pvesh} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAccessSetup runs pve-access-setup against a recording pveum and
// checks the grants: the pool with the templates' and the transfer
// storage as members, SDN (where PUT /cluster/sdn is checked), the node's
// firewall, the cluster firewall switch on "/" and the transfer storage
// without propagation, and each template; a second run keeps the token
// secret.
func TestAccessSetup(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	fake := `#!/bin/sh
echo "$*" >> ` + log + `
case "$*" in
*"list --output-format json"*) echo '[]' ;;
"user token add"*) echo "{\"full-tokenid\":\"$4!$5\",\"value\":\"s3cret\"}" ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakePVE(t, dir)
	secret := filepath.Join(dir, "pve-token")
	run := func() {
		cmd := exec.Command("sh", "pve-access-setup")
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE="+secret, "PVE_INSPECTD_TEMPLATES=9000 9001", "PVE_INSPECTD_TRANSFER_STORAGE=local",
			"PVE_INSPECTD_CONFIG="+filepath.Join(dir, "no-config.toml"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pve-access-setup: %v\n%s", err, out)
		}
	}
	run()
	b, _ := os.ReadFile(log)
	calls := string(b)
	host := nodeName(t)
	tok := access.TokenID(host)
	for _, want := range []string{
		"acl modify /pool/pve-inspect --tokens " + tok + " --roles PVEInspect --propagate 1",
		// the apply on /sdn alone; zones, vnets, subnets below /sdn/zones
		"acl modify /sdn --tokens " + tok + " --roles PVEInspect --propagate 0",
		"acl modify /sdn/zones --tokens " + tok + " --roles PVEInspect --propagate 1",
		// the host's bridges: none but the templates' NICs'
		"acl modify /sdn/zones/localnetwork --tokens " + tok + " --roles NoAccess --propagate 1",
		"acl modify /sdn/zones/localnetwork/vmbr0 --tokens " + tok + " --roles PVEInspectBridge --propagate 0",
		"acl modify /sdn/zones/localnetwork/vmbr1/5 --tokens " + tok + " --roles PVEInspectBridge --propagate 0",
		"acl modify /nodes/" + host + " --tokens " + tok + " --roles PVEInspectNode --propagate 0",
		"acl modify /storage/local --tokens " + tok + " --roles PVEInspectTransfer --propagate 0",
		"acl modify / --tokens " + tok + " --roles PVEInspectCluster --propagate 0",
		"acl modify /vms/9000 --tokens " + tok + " --roles PVEInspectTemplate --propagate 0",
		"acl modify /vms/9001 --tokens " + tok + " --roles PVEInspectTemplate --propagate 0",
		"user token add pve-inspectd@pve " + access.TokenName(host) + " --privsep 1 --comment pve-inspectd node=" + host,
		// clone and resize check Datastore.AllocateSpace on the storage
		"pool modify pve-inspect --storage local-lvm",
		// disk transfers allocate on the dir storage
		"pool modify pve-inspect --storage local",
	} {
		if !strings.Contains(calls, want) {
			t.Errorf("no call %q in:\n%s", want, calls)
		}
	}
	if strings.Contains(calls, "acl modify / --tokens "+tok+" --roles PVEInspect ") {
		t.Error("the main role was granted on /")
	}
	for _, bad := range []string{"localnetwork/tplnet", "localnetwork/vmbr1 "} {
		if strings.Contains(calls, bad) {
			t.Errorf("granted %s (a vnet's NIC, or the bridge of a NIC with a VLAN tag):\n%s", bad, calls)
		}
	}
	if strings.Contains(calls, "acl modify /nodes/"+host+" --tokens "+tok+" --roles PVEInspect ") {
		t.Error("the main role was granted on the node")
	}
	if s, _ := os.ReadFile(secret); !strings.Contains(string(s), "s3cret") {
		t.Fatalf("secret file: %q", s)
	}
	_ = os.Remove(log)
	run()
	b, _ = os.ReadFile(log)
	if strings.Contains(string(b), "token add") || strings.Contains(string(b), "token remove") {
		t.Errorf("second run touched the token:\n%s", b)
	}
}

// runAccessSetup runs pve-access-setup with env against a pveum that
// records its arguments, and returns them, one call a line.
func runAccessSetup(t *testing.T, env ...string) []string {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	fake := `#!/bin/sh
echo "$*" >> ` + log + `
case "$*" in
*"list --output-format json"*) echo '[]' ;;
"user token add"*) echo "{\"full-tokenid\":\"$4!$5\",\"value\":\"s3cret\"}" ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakePVE(t, dir)
	cmd := exec.Command("sh", "pve-access-setup")
	cmd.Env = append(os.Environ(), append([]string{"PATH=" + dir + ":" + os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE=" + filepath.Join(dir, "pve-token"),
		"PVE_INSPECTD_CONFIG=" + filepath.Join(dir, "no-config.toml")}, env...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pve-access-setup: %v\n%s", err, out)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestAccessSetupNoTransferByDefault: without PVE_INSPECTD_TRANSFER_STORAGE
// (the daemon's disk path is off by default) the token gets nothing on any
// transfer storage: Datastore.Allocate on a storage lets it free and
// attach any volume there (pve-storage check_volume_access returns early
// for it). The grant earlier versions made on "local" is taken back.
func TestAccessSetupNoTransferByDefault(t *testing.T) {
	calls := runAccessSetup(t, "PVE_INSPECTD_TEMPLATES=9000")
	joined := strings.Join(calls, "\n")
	for _, bad := range []string{"acl modify /storage/", "--storage local\n", "PVEInspectTransfer --propagate"} {
		if strings.Contains(joined+"\n", bad) {
			t.Errorf("a transfer storage granted by default (%q):\n%s", bad, joined)
		}
	}
	tok := access.TokenID(nodeName(t))
	for _, want := range []string{
		"acl delete /storage/local --users pve-inspectd@pve --roles PVEInspectTransfer",
		"acl delete /storage/local --tokens " + tok + " --roles PVEInspectTransfer",
	} {
		if !slices.Contains(calls, want) {
			t.Errorf("no call %q (the earlier default grant taken back) in:\n%s", want, joined)
		}
	}
}

// TestAccessSetupTransferFromConfig: without PVE_INSPECTD_TRANSFER_STORAGE
// the transfer storage is the daemon's [api] disk_transfer_storage, so an
// upgrade of a node that has the disk path on keeps its grant; a
// commented key is none.
func TestAccessSetupTransferFromConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	tok := access.TokenID(nodeName(t))
	for _, c := range []struct {
		doc, want string
	}{
		{"[api]\nenabled = true\ndisk_transfer_storage = \"tank\"\n", "tank"},
		{"[api]\n  disk_transfer_storage=\"xfer-1\"  # dedicated\n", "xfer-1"},
		{"[api]\ndisk_transfer_storage = 'single-q'\n", "single-q"},
		{"api.disk_transfer_storage = \"dotted\"\n", "dotted"},
		{"[api]\n# disk_transfer_storage = \"local\"\n", ""},
		{"[api]\ndisk_transfer_storage = \"\"\n", ""},
	} {
		if err := os.WriteFile(cfg, []byte(c.doc), 0o644); err != nil {
			t.Fatal(err)
		}
		calls := strings.Join(runAccessSetup(t, "PVE_INSPECTD_CONFIG="+cfg), "\n")
		granted := strings.Contains(calls, "acl modify /storage/")
		if c.want == "" {
			if granted {
				t.Errorf("%q: a transfer storage granted:\n%s", c.doc, calls)
			}
			continue
		}
		for _, w := range []string{"pool modify pve-inspect --storage " + c.want, "acl modify /storage/" + c.want + " --tokens " + tok + " --roles PVEInspectTransfer --propagate 0"} {
			if !strings.Contains(calls, w) {
				t.Errorf("%q: no call %q in:\n%s", c.doc, w, calls)
			}
		}
	}
}

// TestAccessSetupTakesBackLocal: a node set up by an earlier version has
// "local" in the pool and the transfer role on it; unless "local" is the
// transfer storage, both are taken back, also when another storage is.
func TestAccessSetupTakesBackLocal(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	fake := `#!/bin/sh
echo "$*" >> ` + log + `
case "$*" in
"pool list --poolid"*) echo '[{"members":[{"storage":"local","type":"storage"},{"storage":"local-lvm","type":"storage"}],"poolid":"pve-inspect"}]' ;;
*"list --output-format json"*) echo '[]' ;;
"user token add"*) echo "{\"full-tokenid\":\"$4!$5\",\"value\":\"s3cret\"}" ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	tok := access.TokenID(nodeName(t))
	for _, c := range []struct {
		transfer string
		back     bool
	}{{"", true}, {"tank", true}, {"local", false}} {
		_ = os.Remove(log)
		cmd := exec.Command("sh", "pve-access-setup")
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE="+filepath.Join(dir, "pve-token"),
			"PVE_INSPECTD_CONFIG="+filepath.Join(dir, "none.toml"), "PVE_INSPECTD_TRANSFER_STORAGE="+c.transfer)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%q: %v\n%s", c.transfer, err, out)
		}
		b, _ := os.ReadFile(log)
		calls := string(b)
		for _, w := range []string{"pool modify pve-inspect --storage local --delete 1", "acl delete /storage/local --tokens " + tok + " --roles PVEInspectTransfer"} {
			if strings.Contains(calls, w) != c.back {
				t.Errorf("transfer %q: call %q made: %v, want %v\n%s", c.transfer, w, !c.back, c.back, calls)
			}
		}
	}
}

// TestAccessSetupMatchesTable: the roles, pool storages and ACL entries
// pve-access-setup creates are exactly the pveapi/access table's (the
// table the emulator's tests authenticate with and the doctor checks), and
// the script's calls are the golden file's.
func TestAccessSetupMatchesTable(t *testing.T) {
	host := nodeName(t)
	calls := runAccessSetup(t, "PVE_INSPECTD_TEMPLATES=9000 9001")
	roles := map[string][]string{}
	var storages []string
	entries := map[string][]access.ACLEntry{} // by "users"/"tokens"
	for _, c := range calls {
		f := strings.Fields(c)
		switch {
		case len(f) == 5 && f[0] == "role" && (f[1] == "add" || f[1] == "modify") && f[3] == "--privs":
			privs := strings.Split(f[4], ",")
			slices.Sort(privs)
			roles[f[2]] = privs
		case len(f) == 5 && f[0] == "pool" && f[1] == "modify" && f[3] == "--storage":
			storages = append(storages, f[4])
		case len(f) == 9 && f[0] == "acl" && f[1] == "modify":
			who := strings.TrimPrefix(f[3], "--")
			if (who == "users" && f[4] != access.User) || (who == "tokens" && f[4] != access.TokenID(host)) {
				t.Errorf("grant to %s %s", who, f[4])
			}
			entries[who] = append(entries[who], access.ACLEntry{Path: f[2], Role: f[6], Propagate: f[8] == "1"})
		}
	}
	want := map[string][]string{}
	for _, r := range access.Roles() {
		want[r.Name] = r.Privs
	}
	if !maps.EqualFunc(roles, want, slices.Equal) {
		t.Errorf("roles\n%v\nwant (pveapi/access)\n%v", roles, want)
	}
	slices.Sort(storages)
	if ws := access.PoolStorages(); !slices.Equal(storages, ws) {
		t.Errorf("pool storages %v, want %v", storages, ws)
	}
	wantACL := access.ACLEntries(host, "", []int{9000, 9001}, fakeBridges(9000, 9001))
	sortACL := func(es []access.ACLEntry) {
		slices.SortFunc(es, func(a, b access.ACLEntry) int { return strings.Compare(a.Path+" "+a.Role, b.Path+" "+b.Role) })
	}
	sortACL(wantACL)
	for _, who := range []string{"users", "tokens"} {
		got := entries[who]
		sortACL(got)
		if !slices.Equal(got, wantACL) {
			t.Errorf("ACL entries of the %s\n%v\nwant (pveapi/access)\n%v", who, got, wantACL)
		}
	}
	// another transfer storage moves its pool membership and its role
	other := runAccessSetup(t, "PVE_INSPECTD_TRANSFER_STORAGE=tank")
	for _, want := range []string{"pool modify pve-inspect --storage tank", "acl modify /storage/tank --tokens " + access.TokenID(host) + " --roles PVEInspectTransfer --propagate 0"} {
		if !slices.Contains(other, want) {
			t.Errorf("with PVE_INSPECTD_TRANSFER_STORAGE=tank: no call %q", want)
		}
	}
	if got := (access.Setup{Node: host, Transfer: "tank"}.ACLEntries()); !slices.Contains(got, access.ACLEntry{Path: "/storage/tank", Role: access.RoleTransfer}) {
		t.Errorf("access.Setup with transfer tank: %v", got)
	}
	golden := strings.ReplaceAll(strings.Join(calls, "\n")+"\n", "/nodes/"+host+" ", "/nodes/NODE ")
	golden = strings.ReplaceAll(golden, access.TokenName(host), "daemon-NODE")
	golden = strings.ReplaceAll(golden, "node="+host, "node=NODE")
	testkit.Golden(t, "pve-access-setup.calls", []byte(golden))
}

// TestAccessSetupTokenPerNode: on a cluster each node's daemon gets a
// token of its own (PVE_INSPECTD_TOKEN), granted exactly what the default
// one is; a bad name is refused before any pveum call.
func TestAccessSetupTokenPerNode(t *testing.T) {
	def := runAccessSetup(t, "PVE_INSPECTD_TEMPLATES=9000")
	named := runAccessSetup(t, "PVE_INSPECTD_TEMPLATES=9000", "PVE_INSPECTD_TOKEN=daemon-pve2")
	host := nodeName(t)
	if !slices.Contains(named, "user token add pve-inspectd@pve daemon-pve2 --privsep 1 --comment pve-inspectd node="+host+" --output-format json") {
		t.Errorf("no token daemon-pve2 added:\n%s", strings.Join(named, "\n"))
	}
	// every call is the default's with the token's name changed
	var want []string
	for _, c := range def {
		c = strings.ReplaceAll(c+" ", " "+access.TokenName(host)+" ", " daemon-pve2 ")
		c = strings.ReplaceAll(c, "!"+access.TokenName(host)+" ", "!daemon-pve2 ")
		c = strings.TrimSuffix(c, " ")
		want = append(want, c)
	}
	if !slices.Equal(named, want) {
		t.Errorf("calls with PVE_INSPECTD_TOKEN:\n%s\nwant:\n%s", strings.Join(named, "\n"), strings.Join(want, "\n"))
	}
	for _, bad := range []string{"2daemon", "dae mon", "daemon!x", "-x", "d"} {
		dir := t.TempDir()
		log := filepath.Join(dir, "calls")
		if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte("#!/bin/sh\necho \"$*\" >> "+log+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sh", "pve-access-setup")
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE="+filepath.Join(dir, "pve-token"), "PVE_INSPECTD_TOKEN="+bad,
			"PVE_INSPECTD_CONFIG="+filepath.Join(dir, "no-config.toml"))
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "PVE_INSPECTD_TOKEN") {
			t.Errorf("token %q: err %v, output %q; want a refusal naming PVE_INSPECTD_TOKEN", bad, err, out)
		}
		if _, err := os.Stat(log); err == nil {
			t.Errorf("token %q: pveum was called", bad)
		}
	}
}

// nodeName is this machine's node name as pve-access-setup and Proxmox
// take it: the host name without its domain.
func nodeName(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return access.NodeName(h)
}

// TestAccessSetupTemplateBridges: the token's bridge grants on host bridge
// paths no template's NIC is on any more are taken back (the user's stay:
// other nodes' tokens may need them, and another token's are not this
// node's); a template qm cannot read stops the script before its first
// pveum call.
func TestAccessSetupTemplateBridges(t *testing.T) {
	host := nodeName(t)
	tok := access.TokenID(host)
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	entry := func(path, typ, ugid string) string {
		return fmt.Sprintf(`{"path":"%s","propagate":0,"roleid":"%s","type":"%s","ugid":"%s"}`, path, access.RoleBridge, typ, ugid)
	}
	list := "[" + strings.Join([]string{
		entry(access.LocalZonePath+"/vmbr0", "token", tok),
		entry(access.LocalZonePath+"/vmbr9", "token", tok),
		entry(access.LocalZonePath+"/vmbr9", "user", access.User),
		entry(access.LocalZonePath+"/vmbr8", "token", tok+"x"),
		`{"path":"/sdn","propagate":1,"roleid":"PVEInspect","type":"token","ugid":"` + tok + `"}`,
	}, ",") + "]"
	fake := `#!/bin/sh
echo "$*" >> ` + log + `
case "$*" in
"acl list --output-format json") echo '` + list + `' ;;
*"list --output-format json"*) echo '[]' ;;
"user token add"*) echo "{\"full-tokenid\":\"$4!$5\",\"value\":\"s3cret\"}" ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakePVE(t, dir)
	run := func(templates string) (string, error) {
		_ = os.Remove(log)
		cmd := exec.Command("sh", "pve-access-setup")
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE="+filepath.Join(dir, "pve-token"),
			"PVE_INSPECTD_CONFIG="+filepath.Join(dir, "none.toml"), "PVE_INSPECTD_TEMPLATES="+templates)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("9000"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b, _ := os.ReadFile(log)
	var deletes []string
	for _, c := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(c, "acl delete "+access.LocalZonePath) {
			deletes = append(deletes, c)
		}
	}
	if want := []string{"acl delete " + access.LocalZonePath + "/vmbr9 --tokens " + tok + " --roles " + access.RoleBridge}; !slices.Equal(deletes, want) {
		t.Errorf("bridge grants taken back: %q, want %q", deletes, want)
	}
	out, err := run("9000 9999")
	if err == nil || !strings.Contains(out, "template 9999") {
		t.Errorf("an unknown template: err %v, output %q; want a refusal naming it", err, out)
	}
	if b, _ := os.ReadFile(log); len(b) != 0 {
		t.Errorf("pveum called before the refusal:\n%s", b)
	}
}

// TestAccessSetupCTTemplate: a container template's id in
// PVE_INSPECTD_TEMPLATES is read with pct (qm has no config for it): it
// gets the template role, and the host bridge paths of its NICs the
// bridge role, as pveapi/access computes them from its config.
func TestAccessSetupCTTemplate(t *testing.T) {
	tok := access.TokenID(nodeName(t))
	calls := runAccessSetup(t, "PVE_INSPECTD_TEMPLATES=9000 9100")
	bridges := fakeBridges(9000, 9100)
	if !slices.Contains(bridges, "vmbr3") || !slices.Contains(bridges, "vmbr4/7") {
		t.Fatalf("the CT template's bridge paths are not computed: %v", bridges)
	}
	want := []string{"acl modify /vms/9100 --tokens " + tok + " --roles " + access.RoleTemplate + " --propagate 0"}
	for _, b := range bridges {
		want = append(want, "acl modify "+access.LocalZonePath+"/"+b+" --tokens "+tok+" --roles "+access.RoleBridge+" --propagate 0")
	}
	for _, w := range want {
		if !slices.Contains(calls, w) {
			t.Errorf("no call %q in:\n%s", w, strings.Join(calls, "\n"))
		}
	}
}
