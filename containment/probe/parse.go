package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrTooLarge is returned for input over the size bound.
var ErrTooLarge = errors.New("input too large")

// ParseRequest reads and validates a request (the probe's stdin or file).
func ParseRequest(r io.Reader) (*Request, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxRequestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read request: %w", err)
	}
	if len(data) > MaxRequestBytes {
		return nil, fmt.Errorf("request: %w (limit %d bytes)", ErrTooLarge, MaxRequestBytes)
	}
	var req Request
	if err := decodeStrict(data, &req); err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if err := ValidateRequest(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// ValidateRequest checks every field of a request.
func ValidateRequest(req *Request) error {
	if req.Version != Version {
		return fmt.Errorf("request: version %d, want %d", req.Version, Version)
	}
	if req.Concurrency < 0 || req.Concurrency > MaxConcurrency {
		return fmt.Errorf("request: concurrency %d outside 0..%d", req.Concurrency, MaxConcurrency)
	}
	if len(req.Targets) == 0 || len(req.Targets) > MaxTargets {
		return fmt.Errorf("request: %d targets, want 1..%d", len(req.Targets), MaxTargets)
	}
	seen := make(map[string]bool, len(req.Targets))
	local := map[Kind]bool{}
	for i, t := range req.Targets {
		if err := validateTarget(t); err != nil {
			return fmt.Errorf("request: target %d (%q): %w", i, clip(t.ID, MaxIDLen), err)
		}
		if seen[t.ID] {
			return fmt.Errorf("request: target %d: duplicate id %q", i, t.ID)
		}
		seen[t.ID] = true
		if isLocal(t.Kind) {
			// each answers the same every time; one of each keeps the
			// report within its bound (TestWorstCaseReportFits)
			if local[t.Kind] {
				return fmt.Errorf("request: target %d: a second %s target", i, t.Kind)
			}
			local[t.Kind] = true
		}
	}
	return nil
}

func validateTarget(t Target) error {
	if err := validID(t.ID); err != nil {
		return err
	}
	if t.TimeoutMS < 0 || t.TimeoutMS > MaxTimeoutMS {
		return fmt.Errorf("timeout_ms %d outside 0..%d", t.TimeoutMS, MaxTimeoutMS)
	}
	if isLocal(t.Kind) {
		return validateLocal(t)
	}
	ap, err := netip.ParseAddrPort(t.Addr)
	if err != nil {
		return fmt.Errorf("addr: %w", err)
	}
	if ap.Port() == 0 {
		return errors.New("addr: port 0")
	}
	if z := ap.Addr().Zone(); z != "" && !validIfaceName(z) {
		return fmt.Errorf("addr: bad zone %q", z)
	}
	if t.Payload != "" && t.Kind != KindUDP {
		return errors.New("payload: udp targets only")
	}
	if !isLayer2(t.Kind) && (t.Nonce != "" || t.SrcAddr != "" || t.SrcMAC != "") {
		return errors.New("nonce, src_addr and src_mac belong to layer-2 targets only")
	}
	if t.Signal != "" && t.Kind != KindKeepAlive {
		return errors.New("signal: https-keepalive targets only")
	}
	switch t.Kind {
	case KindL2Control, KindL2SpoofAddr, KindL2SpoofMAC, KindL2GratuitousARP:
		return validateLayer2(t, ap.Addr())
	case KindKeepAlive:
		return validateKeepAlive(t, ap.Addr())
	case KindTCP:
		if t.Method != "" || t.Path != "" || len(t.Headers) != 0 || t.QType != "" || t.Host != "" {
			return errors.New("tcp target takes only id, kind, addr, name, resolver, timeout_ms")
		}
		if err := validateResolve(t, ap.Addr()); err != nil {
			return err
		}
	case KindHTTP, KindHTTPS:
		if t.QType != "" {
			return errors.New("http target takes no qtype")
		}
		if err := validateResolve(t, ap.Addr()); err != nil {
			return err
		}
		if t.Method != "" && t.Method != "GET" && t.Method != "PUT" {
			return fmt.Errorf("method %q: want GET or PUT", t.Method)
		}
		if err := validPath(t.Path); err != nil {
			return err
		}
		if len(t.Headers) > maxHeaders {
			return fmt.Errorf("%d headers, at most %d", len(t.Headers), maxHeaders)
		}
		for k, v := range t.Headers {
			if k == "" || len(k) > maxHeaderLen || !headerToken(k) {
				return fmt.Errorf("header name %q", clip(k, 64))
			}
			if len(v) > maxHeaderLen || !printableASCII(v, true) {
				return fmt.Errorf("header %s: bad value", k)
			}
		}
	case KindDNS:
		if t.Method != "" || t.Path != "" || len(t.Headers) != 0 || t.Host != "" || t.Resolver != "" {
			return errors.New("dns target takes no method, path, headers, host or resolver")
		}
		if t.Name == "" || len(t.Name) > maxNameLen || !dnsName(t.Name) {
			return fmt.Errorf("name %q: want a DNS name", clip(t.Name, 64))
		}
		if t.QType != "" && t.QType != "A" && t.QType != "AAAA" {
			return fmt.Errorf("qtype %q: want A or AAAA", t.QType)
		}
	case KindUDP:
		if err := validateResolve(t, ap.Addr()); err != nil {
			return err
		}
		return validateUDP(t)
	default:
		return fmt.Errorf("kind %q: want tcp, http, https, dns, udp, https-keepalive, a layer-2 or a local kind", clip(string(t.Kind), 16))
	}
	return nil
}

// validPath checks an http(s) request path ("" is the default, /).
func validPath(p string) error {
	if p != "" && (!strings.HasPrefix(p, "/") || len(p) > maxPathLen || !printableASCII(p, false)) {
		return fmt.Errorf("path %q: want /..., printable ASCII without spaces, at most %d bytes", clip(p, 64), maxPathLen)
	}
	return nil
}

// validateKeepAlive checks an https-keepalive target: a name to resolve,
// an optional host and path, and the signal file.
func validateKeepAlive(t Target, addr netip.Addr) error {
	if t.Method != "" || len(t.Headers) != 0 || t.QType != "" {
		return errors.New("https-keepalive target takes no method, headers or qtype")
	}
	if t.Name == "" {
		return errors.New("https-keepalive target: name and resolver are required")
	}
	if err := validateResolve(t, addr); err != nil {
		return err
	}
	if err := validPath(t.Path); err != nil {
		return err
	}
	if !strings.HasPrefix(t.Signal, "/") || len(t.Signal) > maxStringField || !printableASCII(t.Signal, false) ||
		path.Clean(t.Signal) != t.Signal {
		return fmt.Errorf("signal %q: want a clean absolute path, printable ASCII without spaces, at most %d bytes", clip(t.Signal, 64), maxStringField)
	}
	return nil
}

// validateResolve checks the name, resolver and host of a target that
// may resolve its address first (http, https, tcp, udp).
func validateResolve(t Target, addr netip.Addr) error {
	if t.Host != "" && (len(t.Host) > maxNameLen || !dnsName(t.Host)) {
		return fmt.Errorf("host %q: want a DNS name", clip(t.Host, 64))
	}
	if (t.Name == "") != (t.Resolver == "") {
		return errors.New("target: name and resolver come together")
	}
	if t.Name == "" {
		return nil
	}
	if len(t.Name) > maxNameLen || !dnsName(t.Name) {
		return fmt.Errorf("name %q: want a DNS name", clip(t.Name, 64))
	}
	if _, err := netip.ParseAddrPort(t.Resolver); err != nil {
		return fmt.Errorf("resolver: %w", err)
	}
	if addr != netip.IPv4Unspecified() {
		return errors.New("target with a name: addr must be 0.0.0.0:port (the name gives the address)")
	}
	return nil
}

// ParseReport parses the probe's output strictly. The input is hostile
// guest data: it is size-bounded, must be exactly one JSON value with known
// fields only, and every field is checked for range, syntax and length.
func ParseReport(data []byte) (*Report, error) {
	if len(data) > MaxReportBytes {
		return nil, fmt.Errorf("probe report: %w (%d bytes, limit %d)", ErrTooLarge, len(data), MaxReportBytes)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("probe report: not valid UTF-8")
	}
	if err := checkKeys(data); err != nil {
		return nil, fmt.Errorf("probe report: %w", err)
	}
	var rep Report
	if err := decodeStrict(data, &rep); err != nil {
		return nil, fmt.Errorf("probe report: %w", err)
	}
	if err := validateReport(&rep); err != nil {
		return nil, fmt.Errorf("probe report: %w", err)
	}
	return &rep, nil
}

func validateReport(rep *Report) error {
	if rep.Version != Version {
		return fmt.Errorf("version %d, want %d", rep.Version, Version)
	}
	if len(rep.Results) > MaxTargets {
		return fmt.Errorf("%d results, at most %d", len(rep.Results), MaxTargets)
	}
	seen := make(map[string]bool, len(rep.Results))
	for i, r := range rep.Results {
		if err := validateResult(r); err != nil {
			return fmt.Errorf("result %d: %w", i, err)
		}
		if seen[r.ID] {
			return fmt.Errorf("result %d: duplicate id %q", i, r.ID)
		}
		seen[r.ID] = true
	}
	return validateFacts(&rep.Facts)
}

func validateResult(r Result) error {
	if err := validID(r.ID); err != nil {
		return err
	}
	switch r.Outcome {
	case OutcomeOpen, OutcomeRefused, OutcomeTimeout, OutcomeUnreachable, OutcomeNoReply, OutcomeError, OutcomeSent, OutcomeReply, OutcomeTried:
		if r.HTTPStatus != 0 || r.RCode != "" || r.Answers != 0 {
			return fmt.Errorf("outcome %s carries response fields", r.Outcome)
		}
	case OutcomeResponse:
		switch {
		case r.HTTPStatus != 0 && r.RCode == "" && r.Answers == 0:
			if r.HTTPStatus < 100 || r.HTTPStatus > 599 {
				return fmt.Errorf("http_status %d outside 100..599", r.HTTPStatus)
			}
		case r.HTTPStatus == 0 && r.RCode != "":
			if !validRCode(r.RCode) {
				return fmt.Errorf("rcode %q", clip(r.RCode, 16))
			}
			if r.Answers < 0 || r.Answers > 65535 {
				return fmt.Errorf("answers %d outside 0..65535", r.Answers)
			}
		default:
			return errors.New("response needs exactly one of http_status or rcode")
		}
	default:
		return fmt.Errorf("unknown outcome %q", clip(string(r.Outcome), 16))
	}
	if err := validateLocalResult(r); err != nil {
		return err
	}
	if !validCanary(r.Canary) {
		return fmt.Errorf("canary %q", clip(string(r.Canary), 16))
	}
	if err := cleanText(r.Detail, MaxDetailLen); err != nil {
		return fmt.Errorf("detail: %w", err)
	}
	if r.ElapsedMS < 0 || r.ElapsedMS > maxElapsedMS {
		return fmt.Errorf("elapsed_ms %d outside 0..%d", r.ElapsedMS, maxElapsedMS)
	}
	return nil
}

func validateFacts(f *Facts) error {
	if len(f.Interfaces) > MaxInterfaces {
		return fmt.Errorf("facts: %d interfaces, at most %d", len(f.Interfaces), MaxInterfaces)
	}
	for _, ifc := range f.Interfaces {
		if !validIfaceName(ifc.Name) {
			return fmt.Errorf("facts: interface name %q", clip(ifc.Name, 32))
		}
		if len(ifc.Addrs) > MaxAddrs {
			return fmt.Errorf("facts: interface %s: %d addresses, at most %d", ifc.Name, len(ifc.Addrs), MaxAddrs)
		}
		for _, a := range ifc.Addrs {
			if _, err := netip.ParsePrefix(a); err != nil {
				return fmt.Errorf("facts: interface %s: address %q", ifc.Name, clip(a, 64))
			}
		}
	}
	for _, rt := range []struct {
		r   *Route
		is4 bool
	}{{f.DefaultRoute4, true}, {f.DefaultRoute6, false}} {
		if rt.r == nil {
			continue
		}
		if !validIfaceName(rt.r.Iface) {
			return fmt.Errorf("facts: route interface %q", clip(rt.r.Iface, 32))
		}
		if rt.r.Gateway != "" {
			a, err := netip.ParseAddr(rt.r.Gateway)
			if err != nil || a.Is4() != rt.is4 || a.Zone() != "" {
				return fmt.Errorf("facts: route gateway %q", clip(rt.r.Gateway, 64))
			}
		}
	}
	if len(f.Resolvers) > MaxAddrs {
		return fmt.Errorf("facts: %d resolvers, at most %d", len(f.Resolvers), MaxAddrs)
	}
	for _, r := range f.Resolvers {
		if _, err := netip.ParseAddr(r); err != nil {
			return fmt.Errorf("facts: resolver %q", clip(r, 64))
		}
	}
	if len(f.Errors) > maxErrors {
		return fmt.Errorf("facts: %d errors, at most %d", len(f.Errors), maxErrors)
	}
	for _, e := range f.Errors {
		if err := cleanText(e, MaxDetailLen); err != nil {
			return fmt.Errorf("facts: error text: %w", err)
		}
	}
	return nil
}

// decodeStrict decodes exactly one JSON value with no unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("decode: trailing data after the JSON value")
	}
	return nil
}

// validID accepts 1..MaxIDLen bytes of [A-Za-z0-9._:/@-].
func validID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("id %q: want 1..%d bytes", clip(id, MaxIDLen), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:/@-", c) >= 0) {
			return fmt.Errorf("id %q: only letters, digits and ._:/@-", clip(id, MaxIDLen))
		}
	}
	return nil
}

func validIfaceName(s string) bool {
	if s == "" || len(s) > maxIfaceNameLen || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '/' || c == ':' || c == '%' {
			return false
		}
	}
	return true
}

func validRCode(s string) bool {
	for _, n := range rcodeNames {
		if s == n {
			return true
		}
	}
	rest, ok := strings.CutPrefix(s, "RCODE")
	if !ok || rest == "" || len(rest) > 4 || (rest[0] == '0' && len(rest) > 1) {
		return false
	}
	n, err := strconv.Atoi(rest)
	return err == nil && n >= 0 && n <= 4095
}

// cleanText accepts at most n bytes of UTF-8 without control characters.
func cleanText(s string, n int) error {
	if len(s) > n {
		return fmt.Errorf("%d bytes, at most %d", len(s), n)
	}
	for _, r := range s {
		if badRune(r) {
			return errors.New("control or invalid character")
		}
	}
	return nil
}

func printableASCII(s string, spaceOK bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || (c == ' ' && !spaceOK) {
			return false
		}
	}
	return true
}

func headerToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func dnsName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
