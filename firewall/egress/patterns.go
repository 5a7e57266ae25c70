package egress

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxEntryChars bounds one allow or deny entry: a DNS name has at most
// 253 characters, and so has an entry, its wildcard label, trailing dot
// and port included (a wildcard's names below it are longer than it is).
const MaxEntryChars = 253

// The entry rules of Compile as regular expressions (RE2 and ECMA-262
// alike, for the OpenAPI document: schemathesis ST202 found the entries
// any string there while Compile refused most). TestEntryPatterns holds
// them to Compile's answers.

// octetRE is an IPv4 octet as netip parses it (no leading zeros).
const octetRE = `(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`

// multiplesRE matches the multiples of step in 0..255.
func multiplesRE(step int) string {
	if step == 1 {
		return octetRE
	}
	var s []string
	for v := 0; v < 256; v += step {
		s = append(s, strconv.Itoa(v))
	}
	return "(?:" + strings.Join(s, "|") + ")"
}

// addrRE is an IPv4 address as netip.ParseAddr takes it.
func addrRE() string { return octetRE + `(?:\.` + octetRE + `){3}` }

// cidrRE is an IPv4 prefix without host bits as netip.ParsePrefix takes
// it (/0 to /32, the length without leading zeros).
func cidrRE() string {
	alts := make([]string, 0, 33)
	for bits := 0; bits <= 32; bits++ {
		oct := make([]string, 4)
		for i := range oct {
			switch free := 8*(i+1) - bits; {
			case free <= 0:
				oct[i] = octetRE
			case free >= 8:
				oct[i] = "0"
			default:
				oct[i] = multiplesRE(1 << free)
			}
		}
		alts = append(alts, strings.Join(oct, `\.`)+"/"+strconv.Itoa(bits))
	}
	return "(?:" + strings.Join(alts, "|") + ")"
}

// nameRE is a domain as parseDomain takes it: an optional wildcard label,
// two or more labels of letters, digits, '-' and '_' (1-63 each, any case),
// the last starting with a letter, and an optional trailing dot.
const nameRE = `(?:\*\.)?(?:[A-Za-z0-9_-]{1,63}\.)+[A-Za-z][A-Za-z0-9_-]{0,62}\.?`

// portRE is a tcp port as splitPort takes it: 1-65535 but 80 and 443
// (leading zeros allowed, as strconv.ParseUint allows them).
const portRE = `0*(?:[1-9]|[1-7][0-9]|8[1-9]|9[0-9]|[1-3][0-9]{2}|4[0-3][0-9]|44[0-24-9]|4[5-9][0-9]|[5-9][0-9]{2}|` +
	`[1-9][0-9]{3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])`

// AllowEntryPattern matches exactly the allow entries Compile takes (with
// mode allowlist), given at most MaxEntryChars characters: an IPv4
// address or CIDR, a domain, a domain with a port.
func AllowEntryPattern() string {
	return fmt.Sprintf(`^(?:%s|%s|%s(?::%s)?)$`, addrRE(), cidrRE(), nameRE, portRE)
}

// DenyEntryPattern matches exactly the deny entries Compile takes, given
// at most MaxEntryChars characters: an IPv4 address or CIDR.
func DenyEntryPattern() string {
	return fmt.Sprintf(`^(?:%s|%s)$`, addrRE(), cidrRE())
}
