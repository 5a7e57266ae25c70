package pveemu

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"
)

// formatErr is a format check failure; its text ends in "\n" because the
// Perl format checks die with newline-terminated messages and
// PVE::JSONSchema embeds them verbatim after "invalid format - ".
func formatErr(format string, a ...any) error { return errors.New(fmt.Sprintf(format, a...) + "\n") }

var (
	reVMID     = regexp.MustCompile(`^[1-9][0-9]{2,8}$`)
	reNode     = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$`)
	reConfigID = regexp.MustCompile(`^(?i:[a-z][a-z0-9_-]+)$`)
	reParseID  = regexp.MustCompile(`^(?i:[a-z][a-z0-9\-_.]*[a-z0-9])$`)
	reBridge   = regexp.MustCompile(`^[-_.\w\d]+$`)
	reDNSName  = regexp.MustCompile(`^(([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$`)
	reSDNID    = regexp.MustCompile(`^(?i:[a-z][a-z0-9]*[a-z0-9])$`)
	reMAC      = regexp.MustCompile(`^(?i:[a-f0-9][02468ace](?::[a-f0-9]{2}){5})$`)
	rePool     = regexp.MustCompile(`^[A-Za-z0-9\.\-_]+(?:/[A-Za-z0-9\.\-_]+){0,2}$`)
	reRealm    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9\.\-_]+$`)
	reUserID   = regexp.MustCompile(`^([^\s:/]+)@([A-Za-z][A-Za-z0-9\.\-_]+)$`)
	reTokenID  = regexp.MustCompile(`^([^\s:/]+@[A-Za-z][A-Za-z0-9\.\-_]+)!([A-Za-z][A-Za-z0-9\.\-_]+)$`)
	reRoleID   = regexp.MustCompile(`^[A-Za-z0-9\.\-_]+$`)
	reGroupID  = regexp.MustCompile(`^[A-Za-z0-9\.\-_]+$`)
	reIface    = regexp.MustCompile(`^(?i:[a-z][a-z0-9_]{1,20}([:.]\d+)?)$`)
	reTag      = regexp.MustCompile(`^(?i:[a-z0-9_][a-z0-9_\-+.]*)$`)
	reURLEnc   = regexp.MustCompile(`^[-%a-zA-Z0-9_.!~*'()]*$`)
	reListSep  = regexp.MustCompile(`[,; \t\x00]+`)
)

// namedFormats are the registered PVE formats the emulator checks, with the
// messages their Perl implementations die with. Formats not listed here are
// accepted unchecked (they only occur on parameters the emulator stores
// without interpreting).
var namedFormats = map[string]func(string) error{
	"pve-vmid": func(v string) error {
		if !reVMID.MatchString(v) {
			return formatErr("value does not look like a valid VM ID")
		}
		return nil
	},
	"pve-node": func(v string) error {
		if !reNode.MatchString(v) {
			return formatErr("value does not look like a valid node name")
		}
		return nil
	},
	"pve-configid": func(v string) error {
		if !reConfigID.MatchString(v) {
			return formatErr("invalid configuration ID '%s'", v)
		}
		return nil
	},
	"pve-storage-id": func(v string) error { return parseID(v, "storage") },
	"pve-bridge-id": func(v string) error {
		if !reBridge.MatchString(v) {
			return formatErr("invalid bridge ID '%s'", v)
		}
		return nil
	},
	"dns-name": func(v string) error {
		if !reDNSName.MatchString(v) {
			return formatErr("value does not look like a valid DNS name")
		}
		return nil
	},
	"pve-sdn-zone-id": func(v string) error { return sdnID("zone", v) },
	"pve-sdn-vnet-id": func(v string) error { return sdnID("vnet", v) },
	"pve-sdn-subnet-id": func(v string) error {
		cidr := v
		if !strings.Contains(v, "/") {
			parts := strings.Split(v, "-")
			ip, mask := "", ""
			if len(parts) > 1 {
				ip = parts[1]
			}
			if len(parts) > 2 {
				mask = parts[2]
			}
			cidr = ip + "/" + mask
		}
		if !validCIDR(cidr) {
			return formatErr("value does not look like a valid CIDR network")
		}
		return nil
	},
	"ip": func(v string) error {
		if _, err := netip.ParseAddr(v); err != nil || strings.Contains(v, "%") {
			return formatErr("value does not look like a valid IP address")
		}
		return nil
	},
	"CIDR": func(v string) error {
		if !validCIDR(v) {
			return formatErr("value does not look like a valid CIDR network")
		}
		return nil
	},
	"mac-addr": func(v string) error {
		if !reMAC.MatchString(v) {
			return formatErr("value does not look like a valid unicast MAC address")
		}
		return nil
	},
	"pve-poolid": func(v string) error {
		if strings.Count(v, "/") > 2 {
			return formatErr("pool name '%s' nested too deeply (max levels = 3)", v)
		}
		if !rePool.MatchString(v) {
			return formatErr("pool name '%s' contains invalid characters", v)
		}
		return nil
	},
	"pve-realm": func(v string) error {
		if !reRealm.MatchString(v) {
			return formatErr("value does not look like a valid realm")
		}
		return nil
	},
	"pve-userid": verifyUsername,
	"pve-tokenid": func(v string) error {
		if !reTokenID.MatchString(v) {
			return formatErr("value '%s' does not look like a valid token ID", v)
		}
		return nil
	},
	"pve-roleid": func(v string) error {
		if !reRoleID.MatchString(v) {
			return formatErr("role name '%s' contains invalid characters", v)
		}
		return nil
	},
	"pve-groupid": func(v string) error {
		if !reGroupID.MatchString(v) {
			return formatErr("group name '%s' contains invalid characters", v)
		}
		return nil
	},
	"pve-priv": func(v string) error {
		if !validPrivs[v] {
			return formatErr("invalid privilege '%s'", v)
		}
		return nil
	},
	"pve-iface": func(v string) error {
		if !reIface.MatchString(v) {
			return formatErr("invalid network interface name '%s'", v)
		}
		return nil
	},
	"pve-tag": func(v string) error {
		if !reTag.MatchString(v) {
			return formatErr("invalid characters in tag")
		}
		return nil
	},
	"urlencoded": func(v string) error {
		if !reURLEnc.MatchString(v) {
			return formatErr("invalid urlencoded string: %s", v)
		}
		return nil
	},
}

func init() {
	namedFormats["pve-sdn-dhcp-range"] = func(v string) error {
		return parsePropertyString(dhcpRangeFormat, v, "dhcp-range")
	}
}

var dhcpRangeFormat = map[string]*Prop{
	"start-address": {Type: "string", Format: "ip"},
	"end-address":   {Type: "string", Format: "ip"},
}

func verifyUsername(v string) error {
	n := len([]rune(v))
	if n < 3 {
		return formatErr("user name '%s' is too short", v)
	}
	if n > 64 {
		return formatErr("user name '%s' is too long (%d > 64)", v, n)
	}
	if !reUserID.MatchString(v) {
		return formatErr("value '%s' does not look like a valid user name", v)
	}
	return nil
}

func parseID(v, typ string) error {
	if len(v) < 2 {
		return formatErr("%s ID '%s' cannot be shorter than 2 characters", typ, v)
	}
	if !reParseID.MatchString(v) {
		return formatErr("%s ID '%s' contains illegal characters", typ, v)
	}
	return nil
}

func sdnID(kind, v string) error {
	if !reSDNID.MatchString(v) {
		return formatErr("%s ID '%s' contains illegal characters", kind, v)
	}
	if len(v) > 8 {
		return formatErr("%s ID '%s' can't be more length than 8 characters", kind, v)
	}
	return nil
}

func validCIDR(v string) bool {
	p, err := netip.ParsePrefix(v)
	if err != nil {
		return false
	}
	if p.Addr().Is4() {
		return p.Bits() > 7
	}
	return p.Bits() > 7
}

// checkFormat applies a schema "format": a named format (optionally with a
// "-list" or "-opt" suffix) or an inline property-string definition.
func checkFormat(schema *Prop, value string) error {
	if schema.formatMap != nil {
		return parsePropertyString(schema.formatMap, value, "")
	}
	name, ok := schema.Format.(string)
	if !ok || name == "regex" {
		return nil
	}
	base, kind := name, ""
	if b, ok := strings.CutSuffix(name, "-list"); ok {
		base, kind = b, "list"
	} else if b, ok := strings.CutSuffix(name, "-opt"); ok {
		base, kind = b, "opt"
	}
	fn, ok := namedFormats[base]
	if !ok {
		if fn, ok = namedFormats[name]; !ok {
			return nil
		}
		kind = ""
	}
	switch kind {
	case "list":
		for _, part := range reListSep.Split(value, -1) {
			if part == "" {
				continue
			}
			if err := fn(part); err != nil {
				return err
			}
		}
		return nil
	case "opt":
		if value == "" {
			return nil
		}
	}
	return fn(value)
}

// parsePropertyString is PVE::JSONSchema::parse_property_string: a
// comma-separated key=value list (one value may omit its key when the format
// has a default_key), every key known, every value checked.
func parsePropertyString(format map[string]*Prop, data, path string) error {
	res := map[string]any{}
	defaultKey := ""
	for _, part := range strings.Split(data, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		k, v, hasEq := strings.Cut(part, "=")
		switch {
		case hasEq && k != "" && v != "":
			if _, dup := res[k]; dup {
				return formatErr("duplicate key in comma-separated list property: %s", k)
			}
			schema := format[k]
			if schema != nil && schema.Alias != "" {
				if schema.KeyAlias != "" {
					if _, dup := res[schema.KeyAlias]; dup {
						return formatErr("key alias '%s' is already defined", schema.KeyAlias)
					}
					res[schema.KeyAlias] = k
				}
				k = schema.Alias
				schema = format[k]
				if _, dup := res[k]; dup {
					return formatErr("key '%s' is already defined (via alias)", k)
				}
			}
			if schema == nil {
				return formatErr("invalid key in comma-separated list property: %s", k)
			}
			if schema.typeName() == "boolean" {
				v = parseBoolText(v)
			}
			res[k] = v
		case !hasEq:
			if defaultKey != "" {
				return formatErr("duplicate key in comma-separated list property: %s", defaultKey)
			}
			keys := make([]string, 0, len(format))
			for key := range format {
				keys = append(keys, key)
			}
			sort.Strings(keys)
			for _, key := range keys {
				if bool(format[key].DefaultKey) {
					defaultKey = key
					if _, dup := res[key]; dup {
						return formatErr("duplicate key in comma-separated list property: %s", key)
					}
					if format[key].typeName() == "boolean" {
						part = parseBoolText(part)
					}
					res[key] = part
					break
				}
			}
			if defaultKey == "" {
				return formatErr("value without key, but schema does not define a default key")
			}
		default:
			return formatErr("missing key in comma-separated list property")
		}
	}
	errs := ParamErrors{}
	checkObject(path, &Prop{Properties: format, AdditionalProperties: 0.0}, res, errs)
	if len(errs) > 0 {
		keys := make([]string, 0, len(errs))
		for k := range errs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		b.WriteString("format error\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %s\n", k, strings.TrimSuffix(errs[k], "\n"))
		}
		return errors.New(b.String())
	}
	return nil
}

func parseBoolText(v string) string {
	switch strings.ToLower(v) {
	case "1", "on", "yes", "true":
		return "1"
	case "0", "off", "no", "false":
		return "0"
	}
	return v
}
