package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestValidateRequest(t *testing.T) {
	ok := func(mod func(*Target)) *Request {
		tg := Target{ID: "x", Kind: KindHTTP, Addr: "169.254.169.254:80", Method: "PUT", Path: "/latest/api/token", Headers: map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "21600"}}
		if mod != nil {
			mod(&tg)
		}
		return &Request{Version: Version, Targets: []Target{tg}}
	}
	cases := []struct {
		name string
		req  *Request
		err  string // "" = valid
	}{
		{"valid http", ok(nil), ""},
		{"valid dns", &Request{Version: 1, Targets: []Target{{ID: "d", Kind: KindDNS, Addr: "10.0.0.1:53", Name: "example.test", QType: "AAAA"}}}, ""},
		{"valid tcp v6 zone", &Request{Version: 1, Targets: []Target{{ID: "t", Kind: KindTCP, Addr: "[fe80::1%eth0]:22"}}}, ""},
		{"version", &Request{Version: 2, Targets: ok(nil).Targets}, "version"},
		{"no targets", &Request{Version: 1}, "targets"},
		{"concurrency", &Request{Version: 1, Concurrency: 65, Targets: ok(nil).Targets}, "concurrency"},
		{"dup id", &Request{Version: 1, Targets: append(ok(nil).Targets, ok(nil).Targets...)}, "duplicate"},
		{"empty id", ok(func(t *Target) { t.ID = "" }), "id"},
		{"id chars", ok(func(t *Target) { t.ID = "a b" }), "id"},
		{"id long", ok(func(t *Target) { t.ID = strings.Repeat("a", 65) }), "id"},
		{"hostname addr", ok(func(t *Target) { t.Addr = "metadata:80" }), "addr"},
		{"no port", ok(func(t *Target) { t.Addr = "10.0.0.1" }), "addr"},
		{"port 0", ok(func(t *Target) { t.Addr = "10.0.0.1:0" }), "port 0"},
		{"method", ok(func(t *Target) { t.Method = "POST" }), "method"},
		{"path", ok(func(t *Target) { t.Path = "no-slash" }), "path"},
		{"path space", ok(func(t *Target) { t.Path = "/a b" }), "path"},
		{"header crlf", ok(func(t *Target) { t.Headers = map[string]string{"X": "a\r\nB: c"} }), "header"},
		{"header name", ok(func(t *Target) { t.Headers = map[string]string{"X:Y": "1"} }), "header name"},
		{"timeout", ok(func(t *Target) { t.TimeoutMS = MaxTimeoutMS + 1 }), "timeout"},
		{"kind", ok(func(t *Target) { t.Kind = "icmp" }), "kind"},
		{"http with name", ok(func(t *Target) { t.Name = "x.test" }), "name"},
		{"valid https by name", ok(func(t *Target) {
			t.Kind, t.Addr, t.Name, t.Resolver, t.Host = KindHTTPS, "0.0.0.0:443", "pypi.org", "10.0.0.1:53", "evil.test"
		}), ""},
		{"name without resolver", ok(func(t *Target) { t.Addr, t.Name = "0.0.0.0:80", "pypi.org" }), "resolver"},
		{"name with an address", ok(func(t *Target) { t.Name, t.Resolver = "pypi.org", "10.0.0.1:53" }), "0.0.0.0"},
		{"bad resolver", ok(func(t *Target) { t.Addr, t.Name, t.Resolver = "0.0.0.0:80", "pypi.org", "gw:53" }), "resolver"},
		{"bad host", ok(func(t *Target) { t.Host = "a b" }), "host"},
		{"tcp with host", &Request{Version: 1, Targets: []Target{{ID: "t", Kind: KindTCP, Addr: "10.0.0.1:22", Host: "a.b"}}}, "tcp target"},
		{"dns with resolver", &Request{Version: 1, Targets: []Target{{ID: "d", Kind: KindDNS, Addr: "10.0.0.1:53", Name: "a.b", Resolver: "10.0.0.1:53"}}}, "dns target"},
		{"tcp with path", &Request{Version: 1, Targets: []Target{{ID: "t", Kind: KindTCP, Addr: "10.0.0.1:22", Path: "/"}}}, "tcp target"},
		{"dns no name", &Request{Version: 1, Targets: []Target{{ID: "d", Kind: KindDNS, Addr: "10.0.0.1:53"}}}, "name"},
		{"dns bad name", &Request{Version: 1, Targets: []Target{{ID: "d", Kind: KindDNS, Addr: "10.0.0.1:53", Name: "a..b"}}}, "name"},
		{"dns qtype", &Request{Version: 1, Targets: []Target{{ID: "d", Kind: KindDNS, Addr: "10.0.0.1:53", Name: "a.b", QType: "TXT"}}}, "qtype"},
	}
	for _, c := range cases {
		err := ValidateRequest(c.req)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: unexpected error %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.err)
		}
	}
}

func TestParseRequestStrict(t *testing.T) {
	for _, in := range []string{
		`{"version":1,"targets":[{"id":"a","kind":"tcp","addr":"10.0.0.1:22"}]} {}`,
		`{"version":1,"targets":[{"id":"a","kind":"tcp","addr":"10.0.0.1:22","extra":1}]}`,
		`{"version":1,"targets":[]}`,
		`[]`,
		``,
	} {
		if _, err := ParseRequest(strings.NewReader(in)); err == nil {
			t.Errorf("ParseRequest(%q) accepted", in)
		}
	}
	big := `{"version":1,"targets":[` + strings.Repeat(" ", MaxRequestBytes) + `]}`
	if _, err := ParseRequest(strings.NewReader(big)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized request: %v, want ErrTooLarge", err)
	}
}

// validReport is a report that ParseReport accepts; cases mutate its JSON.
const validReport = `{"version":1,"facts":{"interfaces":[{"name":"eth0","up":true,"addrs":["10.10.1.50/24","fe80::1/64"]}],` +
	`"default_route4":{"iface":"eth0","gateway":"10.10.1.1"},"default_route6":{"iface":"eth0","gateway":"fe80::1"},"resolvers":["10.10.1.1"]},` +
	`"results":[{"id":"a","outcome":"refused","detail":"connection refused","elapsed_ms":1},` +
	`{"id":"b","outcome":"response","http_status":200,"elapsed_ms":3},` +
	`{"id":"c","outcome":"response","rcode":"NOERROR","answers":1,"elapsed_ms":2},` +
	`{"id":"d","outcome":"response","rcode":"RCODE11","elapsed_ms":2},` +
	`{"id":"e","outcome":"no_reply","elapsed_ms":3000}]}`

func TestParseReport(t *testing.T) {
	rep, err := ParseReport([]byte(validReport))
	if err != nil {
		t.Fatalf("valid report rejected: %v", err)
	}
	if len(rep.Results) != 5 || rep.Results[1].HTTPStatus != 200 || rep.Facts.DefaultRoute4.Gateway != "10.10.1.1" {
		t.Fatalf("parsed wrongly: %+v", rep)
	}
	bad := []struct{ name, from, to string }{
		{"version", `"version":1,"facts"`, `"version":2,"facts"`},
		{"unknown field", `"elapsed_ms":1}`, `"elapsed_ms":1,"x":1}`},
		{"unknown outcome", `"outcome":"refused"`, `"outcome":"filtered"`},
		{"status on refused", `"outcome":"refused",`, `"outcome":"refused","http_status":200,`},
		{"status range", `"http_status":200`, `"http_status":99`},
		{"status and rcode", `"http_status":200`, `"http_status":200,"rcode":"NOERROR"`},
		{"response empty", `"outcome":"response","http_status":200,`, `"outcome":"response",`},
		{"rcode name", `"rcode":"NOERROR"`, `"rcode":"FINE"`},
		{"rcode number", `"rcode":"RCODE11"`, `"rcode":"RCODE4096"`},
		{"rcode leading zero", `"rcode":"RCODE11"`, `"rcode":"RCODE011"`},
		{"answers", `"answers":1`, `"answers":70000`},
		{"negative elapsed", `"elapsed_ms":1}`, `"elapsed_ms":-1}`},
		{"detail control", `"detail":"connection refused"`, `"detail":"a\u001b[31mred"`},
		{"detail bidi", `"detail":"connection refused"`, `"detail":"a\u202eb"`},
		{"detail long", `"detail":"connection refused"`, `"detail":"` + strings.Repeat("x", MaxDetailLen+1) + `"`},
		{"dup id", `{"id":"b"`, `{"id":"a"`},
		{"id chars", `{"id":"a"`, `{"id":"a b"`},
		{"iface name", `"name":"eth0"`, `"name":"../x"`},
		{"iface addr", `"10.10.1.50/24"`, `"10.10.1.50"`},
		{"gateway family", `"gateway":"10.10.1.1"`, `"gateway":"fe80::1"`},
		{"gateway6 zone", `"gateway":"fe80::1"}`, `"gateway":"fe80::1%eth0"}`},
		{"resolver", `"resolvers":["10.10.1.1"]`, `"resolvers":["x"]`},
		{"trailing", `3000}]}`, `3000}]} {}`},
		{"string for int", `"elapsed_ms":3000`, `"elapsed_ms":"3000"`},
		{"key case", `"outcome":"refused"`, `"Outcome":"refused"`},
		{"repeated key", `"outcome":"refused"`, `"outcome":"timeout","outcome":"refused"`},
		{"repeated top key", `{"version":1,`, `{"version":1,"version":1,`},
		{"deep nesting", `"resolvers":["10.10.1.1"]`, `"resolvers":[[[[[[[[["10.10.1.1"]]]]]]]]]`},
		{"float", `"elapsed_ms":3000`, `"elapsed_ms":3.5`},
	}
	for _, c := range bad {
		in := strings.Replace(validReport, c.from, c.to, 1)
		if in == validReport {
			t.Fatalf("%s: mutation did not apply", c.name)
		}
		if _, err := ParseReport([]byte(in)); err == nil {
			t.Errorf("%s: accepted %s", c.name, in)
		}
	}
	if _, err := ParseReport([]byte("\xff" + validReport)); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
	huge := bytes.Repeat([]byte(" "), MaxReportBytes+1)
	if _, err := ParseReport(huge); !errors.Is(err, ErrTooLarge) {
		t.Errorf("huge report: %v, want ErrTooLarge", err)
	}
}

func FuzzParseReport(f *testing.F) {
	f.Add([]byte(validReport))
	f.Add([]byte(`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[]}`))
	f.Add([]byte(`{"version":1,"facts":{"interfaces":null,"resolvers":null},"results":null}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"a","outcome":"response","http_status":599,"elapsed_ms":0}]}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"a","outcome":"response","rcode":"RCODE4095","answers":65535,"elapsed_ms":600000}]}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"u","outcome":"reply","canary":"refused","detail":"48 bytes back","elapsed_ms":3}]}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"u","outcome":"no_reply","canary":"no_reply","elapsed_ms":3}]}`))
	f.Add([]byte(`{"Version":1,"version":2}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"version":1,"results":[{"id":"l","outcome":"sent","detail":"UDP from 02:00:5e:10:00:01 10.10.1.100 to 10.10.1.1:9 on eth0, 3 times","elapsed_ms":41}]}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"l","outcome":"sent","http_status":200,"elapsed_ms":1}]}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"k","outcome":"tried","calls":[{"op":"keyctl get the user keyring","errno":"ENOSYS"},{"op":"mount proc in them"}],"elapsed_ms":0}]}`))
	f.Add([]byte(`{"version":1,"results":[{"id":"i","outcome":"tried","idmap":[{"type":"uid","inside":0,"outside":100000,"count":65536}],"elapsed_ms":0}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := ParseReport(data)
		if err != nil {
			if rep != nil {
				t.Fatal("report returned with an error")
			}
			return
		}
		// Whatever passes is within every bound and survives a round trip.
		if len(rep.Results) > MaxTargets || len(rep.Facts.Interfaces) > MaxInterfaces {
			t.Fatalf("bounds broken: %d results, %d interfaces", len(rep.Results), len(rep.Facts.Interfaces))
		}
		for _, r := range rep.Results {
			if len(r.Detail) > MaxDetailLen || len(r.ID) > MaxIDLen || (r.Outcome == OutcomeResponse) == (r.HTTPStatus == 0 && r.RCode == "") || !validCanary(r.Canary) {
				t.Fatalf("accepted bad result %+v", r)
			}
			if (len(r.Calls) > 0 || len(r.IDMap) > 0) != (r.Outcome == OutcomeTried) || len(r.Calls) > maxCalls || len(r.IDMap) > 2*maxExtents {
				t.Fatalf("accepted bad local result %+v", r)
			}
		}
		again, err := ParseReport(mustJSON(t, rep))
		if err != nil {
			t.Fatalf("re-encoded accepted report rejected: %v", err)
		}
		if !bytes.Equal(mustJSON(t, again), mustJSON(t, rep)) {
			t.Fatal("round trip changed the report")
		}
	})
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"version":1,"targets":[{"id":"a","kind":"tcp","addr":"10.0.0.1:22"}]}`))
	f.Add([]byte(`{"version":1,"concurrency":4,"targets":[{"id":"m","kind":"http","addr":"[fd00:ec2::254]:80","method":"PUT","path":"/latest/api/token","headers":{"X-aws-ec2-metadata-token-ttl-seconds":"21600"}}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"d","kind":"dns","addr":"10.0.0.1:53","name":"example.test","qtype":"A","timeout_ms":500}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"u","kind":"udp","addr":"10.0.0.1:123","payload":"ntp","timeout_ms":500},{"id":"v","kind":"udp","addr":"[fd00::1]:5405"}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"u","kind":"tcp","addr":"10.0.0.1:53","payload":"dns"}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"l1","kind":"l2-control","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeeff"},` +
		`{"id":"l2","kind":"l2-spoof-addr","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeef0","src_addr":"10.10.1.77"},` +
		`{"id":"l3","kind":"l2-spoof-mac","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeef1","src_mac":"02:00:5e:10:00:01"},` +
		`{"id":"l4","kind":"l2-garp","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeef2"}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"t","kind":"tcp","addr":"10.0.0.1:22","nonce":"00112233445566778899aabbccddeeff"}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"p","kind":"local-proc-sys","paths":["/proc/sys/kernel/core_pattern"]},{"id":"n","kind":"local-nesting","timeout_ms":500}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"p","kind":"local-sysfs","paths":["/sys/../etc/shadow"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseRequest(bytes.NewReader(data))
		if err != nil {
			return
		}
		if err := ValidateRequest(req); err != nil {
			t.Fatalf("parsed request fails validation: %v", err)
		}
		for _, tg := range req.Targets {
			if tg.Payload != "" && (tg.Kind != KindUDP || (tg.Payload != PayloadDNS && tg.Payload != PayloadNTP)) {
				t.Fatalf("accepted payload %q on a %s target", tg.Payload, tg.Kind)
			}
			for _, p := range tg.Paths {
				if !strings.HasPrefix(p, "/proc/") && !strings.HasPrefix(p, "/sys/") || path.Clean(p) != p {
					t.Fatalf("accepted path %q on a %s target", p, tg.Kind)
				}
			}
		}
	})
}

func TestMainBadInput(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(context.Background(), nil, strings.NewReader(`{"version":1,"targets":[{"id":"a","kind":"tcp","addr":"nope"}]}`), &out, &errb); code != ExitUsage {
		t.Errorf("exit %d, want %d", code, ExitUsage)
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), "addr") {
		t.Errorf("stdout %q stderr %q: want nothing on stdout and the bad field named", out.String(), errb.String())
	}
	errb.Reset()
	if code := Main(context.Background(), []string{"a", "b"}, nil, &out, &errb); code != ExitUsage {
		t.Errorf("two files: exit %d", code)
	}
	if code := Main(context.Background(), []string{filepath.Join(t.TempDir(), "missing.json")}, nil, &out, &errb); code != ExitUsage {
		t.Errorf("missing file: exit %d", code)
	}
}

func TestMainFromFile(t *testing.T) {
	// A target the fake dialer refuses (no packet leaves): the program must
	// read the file, probe and print a report the host parser accepts.
	p := filepath.Join(t.TempDir(), "req.json")
	if err := os.WriteFile(p, []byte(`{"version":1,"targets":[{"id":"x","kind":"dns","addr":"10.0.0.1:53","name":"a.test","timeout_ms":1}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	refuse := dialerFunc(func(context.Context, string, string) (net.Conn, error) { return nil, syscall.ECONNREFUSED })
	if code := run(context.Background(), []string{"-root", t.TempDir(), p}, nil, &out, &errb, refuse); code != ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	rep, err := ParseReport(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].ID != "x" || rep.Results[0].Outcome != OutcomeRefused {
		t.Fatalf("results %+v", rep.Results)
	}
}

// TestWorstCaseReportFits: a report of MaxTargets results, each as large
// as the probe can make it (longest id, outcome and canary, a detail of
// MaxDetailLen bytes that JSON escapes six-fold; one of each local kind
// with the most calls and id map lines), with the largest facts
// the parser accepts, is written within MaxReportBytes and accepted: a
// full plan never fails on the size bound.
func TestWorstCaseReportFits(t *testing.T) {
	detail := strings.Repeat("<", MaxDetailLen) // encoding/json writes \u003c
	rep := &Report{Version: Version}
	for i := range MaxTargets {
		id := fmt.Sprintf("%0*d", MaxIDLen, i)
		rep.Results = append(rep.Results, Result{ID: id, Outcome: OutcomeResponse, RCode: "RCODE4095", Answers: 65535,
			Detail: detail, ElapsedMS: maxElapsedMS, Canary: OutcomeUnreachable})
	}
	// a request has one target of each local kind: those results carry
	// the most calls and id map lines the parser takes
	for i := range LocalKinds {
		r := &rep.Results[i]
		r.Outcome, r.RCode, r.Answers, r.Canary = OutcomeTried, "", 0, ""
		for range maxCalls {
			r.Calls = append(r.Calls, Call{Op: strings.Repeat("<", maxOpLen), Errno: "E" + strings.Repeat("X", 15)})
		}
		for j := range 2 * maxExtents {
			r.IDMap = append(r.IDMap, IDExtent{Type: []string{"uid", "gid"}[j%2], Inside: 4294967295, Outside: 4294967295, Count: 4294967295})
		}
	}
	addr := "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"
	for i := range MaxInterfaces {
		ifc := Interface{Name: fmt.Sprintf("%015d", i), Up: true}
		for range MaxAddrs {
			ifc.Addrs = append(ifc.Addrs, addr)
		}
		rep.Facts.Interfaces = append(rep.Facts.Interfaces, ifc)
	}
	for range MaxAddrs {
		rep.Facts.Resolvers = append(rep.Facts.Resolvers, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
	}
	for range maxErrors {
		rep.Facts.Errors = append(rep.Facts.Errors, detail)
	}
	rep.Facts.DefaultRoute4 = &Route{Iface: "012345678901234", Gateway: "255.255.255.255"}
	rep.Facts.DefaultRoute6 = &Route{Iface: "012345678901234", Gateway: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rep); err != nil { // as Main writes it
		t.Fatal(err)
	}
	t.Logf("worst-case report: %d bytes for %d results (%d per result), limit %d", buf.Len(), MaxTargets,
		buf.Len()/MaxTargets, MaxReportBytes)
	if buf.Len() > MaxReportBytes {
		t.Fatalf("worst-case report of %d bytes over MaxReportBytes %d", buf.Len(), MaxReportBytes)
	}
	if _, err := ParseReport(bytes.TrimSpace(buf.Bytes())); err != nil {
		t.Fatalf("worst-case report rejected: %v", err)
	}
}
