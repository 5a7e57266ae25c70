package pveemu

import (
	"archive/tar"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// GET /nodes/{node}/storage/{storage}/import-metadata: what an importable
// guest archive holds (pve-storage API2/Storage/Status.pm
// get_import_metadata, Storage.pm get_import_metadata, DirPlugin.pm
// get_import_metadata, GuestImport/OVF.pm parse_ovf). The emulator parses
// the OVF of an OVA in the dir storage's import directory as OVF.pm does,
// with encoding/xml in place of XML::LibXML's XPath.

// The OVF namespaces OVF.pm registers.
const (
	nsOVF  = "http://schemas.dmtf.org/ovf/envelope/1"
	nsRASD = "http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"
	nsVMW  = "http://www.vmware.com/schema/ovf"
)

// maxOVF bounds the OVF the emulator reads (Proxmox's parse is bounded by
// run_fork_with_timeout's 3 s instead).
const maxOVF = 16 << 20

// OVF.pm's resource types: the disk drive, processor, memory and
// Ethernet adapter ids, and the controller types with a bus of
// Proxmox's (pve_type).
const (
	ovfProcessor = 3
	ovfMemory    = 4
	ovfEthernet  = 10
	ovfDiskDrive = 17
)

var ovfControllerBus = map[string]string{"5": "ide", "6": "scsi", "20": "sata"}

// ovfOSTypes is OVF.pm $ostype_ids: CIM_OperatingSystem ids to
// qemu-server's ostype ("other" for the rest).
var ovfOSTypes = map[string]string{
	"18": "winxp", "29": "solaris", "36": "l26", "58": "w2k", "67": "wxp", "69": "w2k3", "70": "w2k3",
	"71": "wxp", "72": "wxp", "73": "wvista", "74": "wvista", "75": "wxp", "76": "w2k8", "77": "w2k8",
	"79": "l26", "80": "l26", "81": "solaris", "82": "l26", "83": "l26", "84": "l26", "85": "l26",
	"87": "l26", "89": "l26", "90": "l26", "91": "l26", "92": "l26", "93": "l26", "94": "l26",
	"95": "l26", "96": "l26", "97": "l24", "98": "l24", "99": "l26", "100": "l26", "101": "l26",
	"103": "win7", "105": "win7", "106": "l26", "107": "l26", "108": "l26", "109": "l26",
	"111": "win8", "112": "win8", "113": "win8", "114": "win8", "115": "win8", "116": "win10",
	"117": "win8", "118": "win8", "119": "win10", "120": "win10", "121": "win10", "122": "win11", "123": "win11",
}

var (
	// reOVFHostResource is parse_ovf_do's match of rasd:HostResource
	// (RFC 3986 unreserved characters).
	reOVFHostResource = regexp.MustCompile(`^(?:ovf:)?/([[:alnum:]\-._~]+)/([[:alnum:]\-._~]+)$`)
	reOVFFileRef      = regexp.MustCompile(`^[[:alnum:]\-._~/]+$`)
	// reOVFCapacityUnit is try_parse_capacity_unit's 'byte * base^exponent'.
	reOVFCapacityUnit = regexp.MustCompile(`^\s*byte\s*\*\s*([0-9]+)\s*\^\s*([0-9]+)\s*$`)
	// reOVFPath is $SAFE_CHAR_WITH_WHITESPACE_CLASS_RE+: a file name with
	// no directory.
	reOVFPath = regexp.MustCompile(`^[ a-zA-Z0-9\-.+=_]+$`)
	// reOVFNameSpace and reOVFNameChar clean the VM name (confdesc wants a
	// DNS name).
	reOVFNameSpace = regexp.MustCompile(`\s+`)
	reOVFNameChar  = regexp.MustCompile(`[^a-zA-Z0-9\-.]`)
)

// ovfNICModels are OVF.pm $allowed_nic_models; any other is e1000.
var ovfNICModels = map[string]bool{"e1000": true, "e1000e": true, "vmxnet3": true}

func (s *Server) importMetadata(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	sid, volname := rq.str("storage"), rq.str("volume")
	volid := sid + ":" + volname
	s.mu.Lock()
	exists := s.storages[sid]
	s.mu.Unlock()
	if !exists {
		return nil, fail("storage '%s' does not exist", sid)
	}
	if sid != dirStorage {
		return nil, fail("emulator: import-metadata of storage '%s' is not emulated", sid)
	}
	dv, ok := parseDirVolname(volname)
	if !ok {
		return nil, fail("unable to parse directory volume name '%s'", volname)
	}
	if _, err := s.checkDirVolumeAccess(rq.authid, volid); err != nil {
		return nil, err
	}
	if dv.vtype != "import" {
		return nil, fail("invalid content type '%s'", dv.vtype)
	}
	switch {
	case strings.Contains(dv.file, ".ova/") || !strings.HasSuffix(dv.file, ".ova") && !strings.HasSuffix(dv.file, ".ovf"):
		return nil, fail("invalid format")
	case strings.HasSuffix(dv.file, ".ovf"):
		return nil, fail("emulator: import-metadata of an .ovf is not emulated")
	}
	path := filepath.Join(s.storageDir(), "import", dv.file)
	data, err := readOVAMember(path)
	if err != nil {
		return nil, err
	}
	md, err := parseOVF(data)
	if err != nil {
		return nil, err
	}
	return md.answer(sid, volname), nil
}

// readOVAMember is OVF.pm read_ovf_file for an OVA: `tar -xO --wildcards
// --occurrence=1 -f OVA '*.ovf'`, the first member whose name ends .ovf
// (in any directory: tar's wildcards match '/' by default).
func readOVAMember(path string) ([]byte, error) {
	tarFail := fail("command 'tar -xO --wildcards --occurrence=1 -f %s '*.ovf'' failed: exit code 2", path)
	f, err := os.Open(path)
	if err != nil {
		return nil, tarFail
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, tarFail
		}
		if err != nil {
			return nil, tarFail
		}
		if !strings.HasSuffix(h.Name, ".ovf") {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxOVF+1))
		if err != nil || len(b) > maxOVF {
			return nil, fail("emulator: the OVF of %s is unreadable or larger than %d bytes", path, maxOVF)
		}
		return b, nil
	}
}

// xnode is an element of a parsed OVF: its namespaced name, attributes,
// and children (elements and text, in order).
type xnode struct {
	name  xml.Name
	attrs []xml.Attr
	kids  []*xnode
	text  string // a text node's data (name empty)
}

// value is the element's XPath string value: the text of every
// descendant, in document order.
func (n *xnode) value() string {
	if n.name.Local == "" {
		return n.text
	}
	var b strings.Builder
	for _, k := range n.kids {
		b.WriteString(k.value())
	}
	return b.String()
}

func (n *xnode) attr(space, local string) (string, bool) {
	for _, a := range n.attrs {
		if a.Name.Space == space && a.Name.Local == local {
			return a.Value, true
		}
	}
	return "", false
}

// children are n's child elements named space:local.
func (n *xnode) children(space, local string) []*xnode {
	var out []*xnode
	for _, k := range n.kids {
		if k.name.Space == space && k.name.Local == local {
			out = append(out, k)
		}
	}
	return out
}

// walk is the elements under the nodes at steps (each ovf: unless
// given), in document order.
func walk(from []*xnode, steps ...xml.Name) []*xnode {
	for _, st := range steps {
		var next []*xnode
		for _, n := range from {
			next = append(next, n.children(st.Space, st.Local)...)
		}
		from = next
	}
	return from
}

// values is XML::LibXML's findvalue of a node-set: its string values
// concatenated.
func values(nodes []*xnode) string {
	var b strings.Builder
	for _, n := range nodes {
		b.WriteString(n.value())
	}
	return b.String()
}

func ovf(local string) xml.Name  { return xml.Name{Space: nsOVF, Local: local} }
func rasd(local string) xml.Name { return xml.Name{Space: nsRASD, Local: local} }

// parseXML builds the element tree of data (XML::LibXML load_xml with
// no_blanks: text made only of white space is dropped).
func parseXML(data []byte) (*xnode, error) {
	d := xml.NewDecoder(strings.NewReader(string(data)))
	root := &xnode{name: xml.Name{Local: "#document"}}
	stack := []*xnode{root}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fail("OVF parse error: %v", err)
		}
		top := stack[len(stack)-1]
		switch t := tok.(type) {
		case xml.StartElement:
			n := &xnode{name: t.Name, attrs: t.Attr}
			top.kids = append(top.kids, n)
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if strings.TrimSpace(string(t)) != "" {
				top.kids = append(top.kids, &xnode{text: string(t)})
			}
		}
	}
	return root, nil
}

// ovfDisk is one disk parse_ovf_do found: its key (bus and address),
// file in the archive and virtual size (-1: unknown).
type ovfDisk struct {
	address, path string
	size          int64
}

// ovfGuest is parse_ovf_do's result after resolve_disks.
type ovfGuest struct {
	qm    map[string]string
	disks []ovfDisk
	nets  []string
}

// parseOVF is OVF.pm parse_ovf_do and resolve_disks for an OVA.
func parseOVF(data []byte) (ovfGuest, error) {
	doc, err := parseXML(data)
	if err != nil {
		return ovfGuest{}, err
	}
	env := walk([]*xnode{doc}, ovf("Envelope"))
	systems := walk(env, ovf("VirtualSystem"))
	hw := walk(systems, ovf("VirtualHardwareSection"), ovf("Item"))
	g := ovfGuest{qm: map[string]string{}}
	name := values(walk(systems, ovf("Name")))
	if name == "" && len(systems) > 0 {
		name, _ = systems[0].attr(nsOVF, "id")
	}
	if name != "" {
		g.qm["name"] = reOVFNameChar.ReplaceAllString(reOVFNameSpace.ReplaceAllString(name, "-"), "")
	}
	g.qm["cores"] = values(walk(itemsOfType(hw, ovfProcessor), rasd("VirtualQuantity")))
	g.qm["memory"] = values(walk(itemsOfType(hw, ovfMemory), rasd("VirtualQuantity")))
	var osID strings.Builder
	for _, n := range walk(systems, ovf("OperatingSystemSection")) {
		v, _ := n.attr(nsOVF, "id")
		osID.WriteString(v)
	}
	g.qm["ostype"] = ovfOSTypes[osID.String()]
	if g.qm["ostype"] == "" {
		g.qm["ostype"] = "other"
	}
	if ovfFirmware(systems) == "efi" {
		g.qm["bios"] = "ovmf"
	}
	for _, item := range itemsOfType(hw, ovfDiskDrive) {
		d, ok, err := ovfDiskOf(env, hw, item)
		if err != nil {
			return ovfGuest{}, err
		}
		if ok {
			g.disks = append(g.disks, d)
		}
	}
	for _, item := range itemsOfType(hw, ovfEthernet) {
		model := strings.ToLower(values(item.children(nsRASD, "ResourceSubType")))
		if !ovfNICModels[model] {
			model = "e1000"
		}
		g.nets = append(g.nets, model)
	}
	if len(g.disks) > 0 {
		order := make([]string, len(g.disks))
		for i, d := range g.disks {
			order[i] = d.address
		}
		g.qm["boot"] = "order=" + strings.Join(order, ";")
	}
	return g, nil
}

// itemsOfType are the items whose rasd:ResourceType is typ (XPath's
// node-set = number: any child whose number value equals).
func itemsOfType(items []*xnode, typ int) []*xnode {
	var out []*xnode
	for _, it := range items {
		for _, rt := range it.children(nsRASD, "ResourceType") {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rt.value()), 64); err == nil && v == float64(typ) {
				out = append(out, it)
				break
			}
		}
	}
	return out
}

// ovfFirmware is vmw:Config[@vmw:key="firmware"]/@vmw:value of the
// hardware sections.
func ovfFirmware(systems []*xnode) string {
	var b strings.Builder
	for _, c := range walk(systems, ovf("VirtualHardwareSection"), xml.Name{Space: nsVMW, Local: "Config"}) {
		if k, _ := c.attr(nsVMW, "key"); k == "firmware" {
			v, _ := c.attr(nsVMW, "value")
			b.WriteString(v)
		}
	}
	return b.String()
}

// ovfDiskOf is parse_ovf_do's loop body for one disk item: ok is false
// for an item it skips (with a warning on Proxmox); an invalid file path
// is an error.
func ovfDiskOf(env, hw []*xnode, item *xnode) (ovfDisk, bool, error) {
	m := reOVFHostResource.FindStringSubmatch(values(item.children(nsRASD, "HostResource")))
	if m == nil {
		return ovfDisk{}, false, nil
	}
	diskID := m[2]
	var fileRef, capacity, unit string
	for _, d := range walk(env, ovf("DiskSection"), ovf("Disk")) {
		if id, _ := d.attr(nsOVF, "diskId"); id != diskID {
			continue
		}
		v, _ := d.attr(nsOVF, "fileRef")
		fileRef += v
		v, _ = d.attr(nsOVF, "capacity")
		capacity += v
		v, _ = d.attr(nsOVF, "capacityAllocationUnits")
		unit += v
	}
	size := int64(-1)
	if u := reOVFCapacityUnit.FindStringSubmatch(unit); u != nil {
		base, _ := strconv.ParseFloat(u[1], 64)
		exp, _ := strconv.ParseFloat(u[2], 64)
		c, _ := strconv.ParseFloat(strings.TrimSpace(capacity), 64) // Perl: a non-number is 0
		size = int64(c * math.Pow(base, exp))
	}
	if fileRef == "" || !reOVFFileRef.MatchString(fileRef) {
		return ovfDisk{}, false, nil
	}
	parent := values(item.children(nsRASD, "Parent"))
	var ctrlType string
	for _, c := range hw {
		if values(c.children(nsRASD, "InstanceID")) == parent {
			ctrlType += values(c.children(nsRASD, "ResourceType"))
		}
	}
	if ctrlType == "" {
		return ovfDisk{}, false, nil
	}
	address := ovfControllerBus[ctrlType] + values(item.children(nsRASD, "AddressOnParent"))
	var href string
	for _, f := range walk(env, ovf("References"), ovf("File")) {
		if id, _ := f.attr(nsOVF, "id"); id == fileRef {
			v, _ := f.attr(nsOVF, "href")
			href += v
		}
	}
	if href == "" {
		return ovfDisk{}, false, nil
	}
	if !reOVFPath.MatchString(href) || href == "." || href == ".." {
		return ovfDisk{}, false, fail("referenced path '%s' is invalid", href)
	}
	return ovfDisk{address: address, path: href, size: size}, true, nil
}

// answer is DirPlugin.pm get_import_metadata's result for the OVA volname
// of storage sid: each disk as an import-from source of the archive's
// member (the last of one key wins, as in Perl's hash), efidisk0 and the
// warning efi-state-lost for an OVMF guest.
func (g ovfGuest) answer(sid, volname string) map[string]any {
	disks := map[string]any{}
	for _, d := range g.disks {
		v := map[string]any{"volid": sid + ":" + volname + "/" + d.path}
		if d.size >= 0 {
			v["size"] = d.size
		}
		disks[d.address] = v
	}
	warnings := []any{map[string]any{"type": "ova-needs-extracting"}}
	if g.qm["bios"] == "ovmf" {
		disks["efidisk0"] = 1
		warnings = append(warnings, map[string]any{"type": "efi-state-lost", "key": "bios", "value": "ovmf"})
	}
	net := map[string]any{}
	for i, model := range g.nets {
		net[fmt.Sprintf("net%d", i)] = map[string]any{"model": model}
	}
	args := map[string]any{}
	for k, v := range g.qm {
		args[k] = v
	}
	return map[string]any{"type": "vm", "source": volname, "create-args": args, "disks": disks, "warnings": warnings, "net": net}
}
