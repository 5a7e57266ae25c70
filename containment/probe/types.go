package probe

// Version is the wire format version of [Request] and [Report].
const Version = 1

// Kind is what a target asks the probe to do.
type Kind string

// Target kinds.
const (
	KindTCP   Kind = "tcp"   // TCP connect to Addr
	KindHTTP  Kind = "http"  // HTTP request (Method, Path, Headers) to Addr
	KindHTTPS Kind = "https" // HTTPS request to Addr, certificate not verified
	KindDNS   Kind = "dns"   // DNS query over UDP for Name (QType) to the server Addr
)

// Layer-2 target kinds (layer2.go): crafted Ethernet frames sent raw on the
// interface of the IPv4 default route, broadcast, toward the gateway (the
// address of Addr). Each frame carries the target's Nonce; only the node,
// watching its bridge, can tell whether a frame got anywhere, so the
// probe's result is [OutcomeSent] or [OutcomeError].
const (
	// KindL2Control: a legitimate UDP datagram (own MAC, own address): the
	// positive control of the raw path.
	KindL2Control Kind = "l2-control"
	// KindL2SpoofAddr: the datagram from the own MAC but the source address SrcAddr.
	KindL2SpoofAddr Kind = "l2-spoof-addr"
	// KindL2SpoofMAC: the datagram from the own address but the source MAC SrcMAC.
	KindL2SpoofMAC Kind = "l2-spoof-mac"
	// KindL2GratuitousARP: ARP request and reply, broadcast, claiming the
	// gateway's address for the own MAC.
	KindL2GratuitousARP Kind = "l2-garp"
)

// Limits that both sides enforce.
const (
	MaxTargets         = 2048            // targets in one request (a report of that many worst-case results stays under MaxReportBytes)
	MaxIDLen           = 64              // bytes in a target id
	MaxDetailLen       = 256             // bytes in a result detail
	MaxReportBytes     = 4 << 20         // bytes of report JSON the host accepts (below the guest agent's 16 MiB output cap)
	MaxRequestBytes    = 1 << 20         // bytes of request JSON the probe accepts
	MaxTimeoutMS       = 60_000          // longest per-target timeout
	DefaultTimeout     = 3_000           // per-target timeout in ms when the target names none
	MaxInterfaces      = 64              // interfaces in Facts
	MaxAddrs           = 64              // addresses per interface, resolvers
	maxNameLen         = 253             // DNS name
	maxPathLen         = 1024            // HTTP path
	maxHeaders         = 16              // HTTP headers per target
	maxHeaderLen       = 256             // bytes per header name or value
	maxIfaceNameLen    = 15              // Linux IFNAMSIZ - 1
	maxErrors          = 16              // Facts.Errors entries
	maxStringField     = MaxDetailLen    // generic bound for short strings
	maxHTTPBody        = 64 << 10        // response body bytes the probe reads and discards
	MaxConcurrency     = 64              // parallel probes
	DefaultConcurrency = 16              // parallel probes when the request names none
	maxElapsedMS       = 10 * 60 * 1_000 // sanity bound on reported elapsed time
)

// Request is the probe's input.
type Request struct {
	Version     int      `json:"version"`
	Concurrency int      `json:"concurrency,omitempty"` // parallel probes; 0 = 16, at most 64
	Targets     []Target `json:"targets"`
}

// Target is one thing to try.
type Target struct {
	ID   string `json:"id"`   // unique within the request, echoed in the result
	Kind Kind   `json:"kind"` // what to do
	// Addr is "ip:port" or "[ipv6]:port" with a literal address. An IPv6
	// link-local address without a zone gets the interface of the IPv4
	// default route as its zone.
	Addr    string            `json:"addr"`
	Method  string            `json:"method,omitempty"`  // http(s): GET (default) or PUT
	Path    string            `json:"path,omitempty"`    // http(s): request path, default "/"
	Headers map[string]string `json:"headers,omitempty"` // http(s): extra request headers
	// Name is the dns query name; for http(s), a name resolved (A) through
	// Resolver first: the request goes to its first address at Addr's port
	// (Addr's address must then be 0.0.0.0), as a client would connect.
	Name string `json:"name,omitempty"`
	// Resolver is the DNS server (ip:port) http(s) resolves Name through.
	Resolver string `json:"resolver,omitempty"`
	// Host is the http(s) request's Host and TLS server name (default:
	// Name, else the address).
	Host      string `json:"host,omitempty"`
	QType     string `json:"qtype,omitempty"` // dns: A (default) or AAAA
	TimeoutMS int    `json:"timeout_ms,omitempty"`
	// Payload is what a udp target sends: PayloadDNS, PayloadNTP or ""
	// (PayloadGeneric).
	Payload string `json:"payload,omitempty"`

	// Nonce (layer-2 kinds) is NonceLen random bytes in lowercase hex that
	// every frame of the target carries.
	Nonce string `json:"nonce,omitempty"`
	// SrcAddr (l2-spoof-addr) is the IPv4 source address to claim.
	SrcAddr string `json:"src_addr,omitempty"`
	// SrcMAC (l2-spoof-mac) is the source MAC to claim, lowercase with colons.
	SrcMAC string `json:"src_mac,omitempty"`

	// Signal (https-keepalive) is the absolute guest path whose creation
	// tells the target to send its second request.
	Signal string `json:"signal,omitempty"`

	// Paths (local-proc-sys, local-sysfs) are the files to open for
	// writing: absolute, clean, under /proc/ or /sys/ respectively.
	Paths []string `json:"paths,omitempty"`
}

// Outcome is what the network answered.
type Outcome string

// Outcomes. Every target ends in exactly one.
const (
	// OutcomeOpen: the TCP handshake completed (tcp), or it completed and
	// the HTTP exchange then failed (http, https; Detail says how).
	OutcomeOpen Outcome = "open"
	// OutcomeRefused: the peer answered with a reset (tcp, http) or an ICMP
	// port unreachable (dns): a route exists.
	OutcomeRefused Outcome = "refused"
	// OutcomeTimeout: no answer at all to the connection attempt.
	OutcomeTimeout Outcome = "timeout"
	// OutcomeUnreachable: no route, or an ICMP unreachable/prohibited came back.
	OutcomeUnreachable Outcome = "unreachable"
	// OutcomeResponse: an HTTP response (HTTPStatus) or a DNS reply (RCode,
	// Answers) arrived.
	OutcomeResponse Outcome = "response"
	// OutcomeNoReply: a DNS query was sent and nothing came back.
	OutcomeNoReply Outcome = "no_reply"
	// OutcomeError: the probe could not try (bad target, local error).
	OutcomeError Outcome = "error"
	// OutcomeSent: the layer-2 frames were handed to the interface; whether
	// they arrived anywhere only the node can tell.
	OutcomeSent Outcome = "sent"
)

// Result is the probe's answer for one target.
type Result struct {
	ID         string  `json:"id"`
	Outcome    Outcome `json:"outcome"`
	HTTPStatus int     `json:"http_status,omitempty"` // response from http(s)
	RCode      string  `json:"rcode,omitempty"`       // response from dns: NOERROR, NXDOMAIN, REFUSED, ...
	Answers    int     `json:"answers,omitempty"`     // response from dns: answer records
	Detail     string  `json:"detail,omitempty"`      // error text or extra facts, at most MaxDetailLen bytes
	ElapsedMS  int     `json:"elapsed_ms"`
	// Canary (udp) is what a datagram to a closed high port on the same
	// address got: refused (the host says when nothing listens), reply,
	// unreachable or no_reply; "" when it is not known.
	Canary Outcome `json:"canary,omitempty"`
	// Calls (a local kind, OutcomeTried) are the calls it made and what
	// the kernel answered (local.go).
	Calls []Call `json:"calls,omitempty"`
	// IDMap (KindIDMap, OutcomeTried) are the lines of the probe's
	// uid_map and gid_map.
	IDMap []IDExtent `json:"idmap,omitempty"`
}

// Facts are the guest's local network facts, the base of the positive controls.
type Facts struct {
	Interfaces []Interface `json:"interfaces"`
	// DefaultRoute4 is the IPv4 default route (first by metric), nil if none.
	DefaultRoute4 *Route `json:"default_route4,omitempty"`
	// DefaultRoute6 is the IPv6 default route, nil if none.
	DefaultRoute6 *Route `json:"default_route6,omitempty"`
	// Resolvers are the nameserver lines of /etc/resolv.conf.
	Resolvers []string `json:"resolvers"`
	// Errors are facts the probe failed to read.
	Errors []string `json:"errors,omitempty"`
}

// Interface is one network interface with its addresses in CIDR form.
type Interface struct {
	Name  string   `json:"name"`
	Up    bool     `json:"up"`
	Addrs []string `json:"addrs"`
}

// Route is a default route.
type Route struct {
	Iface   string `json:"iface"`
	Gateway string `json:"gateway,omitempty"` // "" when the route has no gateway
}

// Report is the probe's output.
type Report struct {
	Version int      `json:"version"`
	Facts   Facts    `json:"facts"`
	Results []Result `json:"results"`
}
